/* qwen3next.c - the input preparation qwen3next's DeltaNet layers need.
 *
 * Owns: projecting a qwen3next DeltaNet layer's input and reordering the
 * projections into the layout dnet_forward takes (qwen35's: conv input
 * [q all | k all | v all], z, and beta / alpha logits by value head).
 * qwen3next groups them by key head instead: ssm_ba holds per key head g
 * [b (r) | a (r)], and legacy files fuse q, k, v and z into ssm_in, per key
 * head g [q | k | v (r*d_v) | z (r*d_v)].
 * Does not own: binding those weights (model.c) or the mixer (deltanet.c).
 * ref: docs/models.md 1.4(a) and 2.3 item 5.
 */
#include <string.h>

#include "layers.h"
#include "matmul.h"

void qwen3next_dnet_inputs(const model *m, const layer *L, const float *xn, int T, bool decode, float *mm,
                           float *fused, float *qkv, float *z, float *beta, float *alpha)
{
    const int NK = m->ssm_n_k, NV = m->ssm_n_v, DK = m->ssm_d_k, DV = m->ssm_d_v, r = NV / NK;
    if (L->legacy_ssm_in) {
        const int W = 2 * NK * DK + 2 * NV * DV, G = 2 * DK + 2 * r * DV;
        matmul(fused, &L->ssm_in, xn, T, decode, mm);
        for (int row = 0; row < T; row++) {
            const float *src = fused + (size_t)row * W;
            float *qkv_r = qkv + (size_t)row * m->conv_dim, *z_r = z + (size_t)row * NV * DV;
            for (int g = 0; g < NK; g++) {
                const float *grp = src + (size_t)g * G;
                memcpy(qkv_r + (size_t)g * DK, grp, sizeof(float) * DK);
                memcpy(qkv_r + (size_t)(NK + g) * DK, grp + DK, sizeof(float) * DK);
                memcpy(qkv_r + (size_t)2 * NK * DK + (size_t)g * r * DV, grp + 2 * DK, sizeof(float) * r * DV);
                memcpy(z_r + (size_t)g * r * DV, grp + 2 * DK + r * DV, sizeof(float) * r * DV);
            }
        }
    } else {
        matmul(qkv, &L->wqkv, xn, T, decode, mm);
        matmul(z, &L->wz, xn, T, decode, mm);
    }
    /* beta and alpha logits of value head g*r + j */
    matmul(fused, &L->ssm_ba, xn, T, decode, mm);
    for (int row = 0; row < T; row++) {
        const float *ba = fused + (size_t)row * 2 * NV;
        for (int g = 0; g < NK; g++)
            for (int j = 0; j < r; j++) {
                beta[(size_t)row * NV + g * r + j] = ba[g * 2 * r + j];
                alpha[(size_t)row * NV + g * r + j] = ba[g * 2 * r + r + j];
            }
    }
}
