/* panel_tile.h - the switch from a tile's run-time shape to the kernel
 * instantiated for it, shared by the panel kernels (panels.c, simd_bf16.c).
 *
 * Owns: only the case list. Every panel kernel multiplies RV panels (1 or
 * 2) by T tokens with RV and T compile-time constants (the accumulators
 * stay in registers only when the loops over them are unrolled), so each
 * call site switches on rv * 16 + nt over the shapes it instantiates.
 * A file defines CASE(RV_, T_) as `case (RV_) * 16 + (T_): kernel(..., RV_,
 * T_); break;` and writes PANEL_TILE_SWITCH(PANEL_TILE_CASES12, CASE, rv,
 * nt). Does not own: the kernels or their tile widths.
 */
#ifndef HYSERVE_PANEL_TILE_H
#define HYSERVE_PANEL_TILE_H

/* RV_ panels by 1-6 and 1-12 tokens */
#define PANEL_TILE_CASES6(CASE, RV_) CASE(RV_, 1) CASE(RV_, 2) CASE(RV_, 3) CASE(RV_, 4) CASE(RV_, 5) CASE(RV_, 6)
#define PANEL_TILE_CASES12(CASE, RV_)                                                                          \
    PANEL_TILE_CASES6(CASE, RV_) CASE(RV_, 7) CASE(RV_, 8) CASE(RV_, 9) CASE(RV_, 10) CASE(RV_, 11) CASE(RV_, 12)

/* the switch over 1 or 2 panels by the tokens CASES lists */
#define PANEL_TILE_SWITCH(CASES, CASE, rv, nt)                                                                 \
    switch ((rv) * 16 + (nt)) {                                                                                \
        CASES(CASE, 1) CASES(CASE, 2)                                                                          \
    }

#endif
