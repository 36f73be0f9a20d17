/* fuzz.h - what the libFuzzer targets of tests/fuzz/ share.
 *
 * Owns: handing an input to readers that take a path (a memfd seen through
 * /proc/self/fd) and the check that turns a broken property into a crash
 * libFuzzer records. Does not own: any target's properties (each
 * fuzz_<name>.c states its own).
 * ref: https://llvm.org/docs/LibFuzzer.html (the entry points).
 */
#ifndef HYSERVE_FUZZ_H
#define HYSERVE_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A broken property: print it and abort, so libFuzzer keeps the input. */
#define FUZZ_CHECK(cond)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__, #cond);    \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* The input as a file: one memfd reused across runs, rewritten each time.
 * Returns its /proc path (static storage), or NULL if it cannot be made. */
static inline const char *fuzz_file(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("hyserve-fuzz", MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0)
        return NULL;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w <= 0)
            return NULL;
        done += (size_t)w;
    }
    return path;
}

/* Occurrences of pat in s[0..n) lying wholly outside the data spans
 * data[2i] .. data[2i + 1] (a chat prompt's markup, not its content). */
static inline int fuzz_markup_count(const char *s, size_t n, const size_t *data, int n_data, const char *pat)
{
    const size_t k = strlen(pat);
    int c = 0;
    for (size_t i = 0; i + k <= n; i++) {
        if (memcmp(s + i, pat, k) != 0)
            continue;
        bool inside = false;
        for (int d = 0; d < n_data && !inside; d++)
            inside = i < data[2 * d + 1] && i + k > data[2 * d];
        c += !inside;
    }
    return c;
}

/* The markup of a rendered chat prompt opens and closes the right turns
 * outside its data spans, whatever the content holds. ChatML: one turn a
 * message, except that consecutive tool results share one user turn (as
 * the Qwen3 template writes them, in <tool_response> blocks). Llama 3:
 * llama_turns (one a message, plus 3.1's own system turn). Both then open
 * the generation prompt. */
static inline void fuzz_check_turns(int kind, const char *out, size_t n, const size_t *spans, int n_spans,
                                    const chat_msg *msgs, int n_msgs, int llama_turns)
{
    if (kind == CHAT_CHATML) {
        int t = 0;
        for (int i = 0; i < n_msgs; i++)
            t += !(i > 0 && !strcmp(msgs[i].role, "tool") && !strcmp(msgs[i - 1].role, "tool"));
        FUZZ_CHECK(fuzz_markup_count(out, n, spans, n_spans, "<|im_start|>") == t + 1);
        FUZZ_CHECK(fuzz_markup_count(out, n, spans, n_spans, "<|im_end|>") == t);
    } else {
        FUZZ_CHECK(fuzz_markup_count(out, n, spans, n_spans, "<|start_header_id|>") == llama_turns + 1);
        FUZZ_CHECK(fuzz_markup_count(out, n, spans, n_spans, "<|eot_id|>") == llama_turns);
    }
}

#endif
