/* ops.c - norms, RoPE, softmax and the matrix products (OpenBLAS).
 * ref: ../shared/docs/architectures.md sections 1.3 (norms), 1.5 (RoPE). */
#include "ops.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "quant.h"

/* Rows dequantized per tile when a non-f32 weight meets a multi-token
 * input: each thread turns a tile to f32 and runs sgemm on it. */
#define MM_TILE_ROWS 64

static int n_threads_set = 1;

void ops_set_threads(int n)
{
    if (n <= 0)
        n = omp_get_num_procs();
    n_threads_set = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int ops_get_threads(void)
{
    return n_threads_set;
}

void rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    if (w)
        for (int i = 0; i < n; i++)
            y[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < n; i++)
            y[i] = x[i] * r;
}

void l2norm(float *x, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double nrm = sqrt(ss);
    float r = (float)(1.0 / (nrm > eps ? nrm : eps));
    for (int i = 0; i < n; i++)
        x[i] *= r;
}

void softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    if (mx == -INFINITY) {              /* every entry masked: no weight anywhere */
        memset(x, 0, (size_t)n * sizeof *x);
        return;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);         /* exp(-inf) = 0 exactly */
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

void rope_neox(float *x, int n_rot, const float *inv_freq, int pos)
{
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        double ang = (double)pos * inv_freq[i];
        float c = (float)cos(ang), s = (float)sin(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;           /* x'[i]      = x[i] cos - x[i+half] sin */
        x[i + half] = b * c + a * s;    /* x'[i+half] = x[i+half] cos + x[i] sin */
    }
}

void rope_norm(float *x, int n_rot, const float *inv_freq, int pos)
{
    for (int i = 0; i < n_rot / 2; i++) {
        double ang = (double)pos * inv_freq[i];
        float c = (float)cos(ang), s = (float)sin(ang);
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = b * c + a * s;
    }
}

void rope(float *x, int type, int n_rot, const float *inv_freq, int pos)
{
    if (type == ROPE_NORM)
        rope_norm(x, n_rot, inv_freq, pos);
    else
        rope_neox(x, n_rot, inv_freq, pos);
}

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
          const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

long matmul_scratch_floats(const weight *W, int n_tok)
{
    if (W->type == GGML_F32 || n_tok == 1)
        return 0;
    return (long)omp_get_max_threads() * MM_TILE_ROWS * W->n_in;
}

void matmul(float *restrict Y, const weight *W, const float *restrict X, int n_tok, float *scratch)
{
    const int n_in = W->n_in, n_out = W->n_out;
    if (W->type == GGML_F32 && n_tok > 1) {
        /* Y = X W^T */
        gemm(false, true, n_tok, n_out, n_in, 1.0f, X, n_in, W->data, n_in, 0.0f, Y, n_out);
        return;
    }
    if (n_tok == 1) {
        /* matrix-vector: one dot product per row, rows split across threads */
        const char *base = W->data;
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < n_out; o++)
            Y[o] = dot_row(W->type, base + (size_t)o * W->row_bytes, X, n_in);
        return;
    }
    /* multi-token, non-f32: dequantize tiles of rows, sgemm each tile */
    const int n_tiles = (n_out + MM_TILE_ROWS - 1) / MM_TILE_ROWS;
    #pragma omp parallel
    {
        float *tile = scratch + (long)omp_get_thread_num() * MM_TILE_ROWS * n_in;
        #pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < n_tiles; it++) {
            int r0 = it * MM_TILE_ROWS;
            int nr = n_out - r0 < MM_TILE_ROWS ? n_out - r0 : MM_TILE_ROWS;
            for (int r = 0; r < nr; r++)
                dequant_row(W->type, (const char *)W->data + (size_t)(r0 + r) * W->row_bytes,
                            tile + (long)r * n_in, n_in);
            gemm(false, true, n_tok, nr, n_in, 1.0f, X, n_in, tile, n_in, 0.0f, Y + r0, n_out);
        }
    }
}
