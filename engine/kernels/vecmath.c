/* vecmath.c - norms, RoPE, softmax and the elementwise gates.
 * ref: docs/models.md sections 1.3 (norms), 1.5 (RoPE). */
#include "vecmath.h"

#include <math.h>
#include <string.h>

#include "cpu.h"

/* The fast forms go through the kernel table (cpu.h): the AVX2 kernels of
 * simd.h where they are in use, the references below otherwise. */
void vec_silu_mul(float *y, const float *x, const float *b, long n)
{
    cpu_kern.silu_mul(y, x, b, n);
}

void vec_sigmoid_mul(float *y, const float *g, long n)
{
    cpu_kern.sigmoid_mul(y, g, n);
}

void silu_mul_ref(float *y, const float *x, const float *b, long n)
{
    for (long i = 0; i < n; i++)
        y[i] = silu(x[i]) * (b ? b[i] : 1.0f);
}

void sigmoid_mul_ref(float *y, const float *g, long n)
{
    for (long i = 0; i < n; i++)
        y[i] *= sigmoid(g[i]);
}

double sumsq_ref(const float *x, int n)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    return ss;
}

void scale_ref(float *y, const float *x, float r, const float *w, int n)
{
    if (w)
        for (int i = 0; i < n; i++)
            y[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < n; i++)
            y[i] = x[i] * r;
}

void rmsnorm(float *y, const float *x, const float *w, int n, float eps)
{
    float r = (float)(1.0 / sqrt(cpu_kern.sumsq(x, n) / n + eps));
    cpu_kern.scale(y, x, r, w, n);
}

void l2norm(float *x, int n, float eps)
{
    double nrm = sqrt(cpu_kern.sumsq(x, n));
    cpu_kern.scale(x, x, (float)(1.0 / (nrm > eps ? nrm : eps)), NULL, n);
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
