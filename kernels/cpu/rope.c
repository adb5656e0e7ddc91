/*
 * kernels/cpu/rope.c — rotary position embedding, NeoX style (dims i and
 * i + D/2 rotate together, Hugging Face's `rotate_half`), with the Llama-3
 * and linear frequency scalings.
 *
 * Frequencies and angles are computed in float64 once per forward (the
 * table is shared by every layer), so positions in the hundreds of
 * thousands keep full float32 accuracy in cos/sin.
 */
#include "cpu_kernels.h"

#include <math.h>

void loom_cpu_rope_inv_freq(double *inv_freq, int32_t head_dim, double theta,
                            loom_rope_scaling scaling, double factor, double low_freq_factor,
                            double high_freq_factor, double original_context) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double f = pow(theta, -(double)(2 * i) / (double)head_dim);
        if (scaling == LOOM_ROPE_SCALING_LINEAR && factor > 0) {
            f /= factor;
        } else if (scaling == LOOM_ROPE_SCALING_LLAMA3 && factor > 0) {
            /* transformers' _compute_llama3_parameters, element by element */
            double low_freq_wavelen = original_context / low_freq_factor;
            double high_freq_wavelen = original_context / high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            double scaled = wavelen > low_freq_wavelen ? f / factor : f;
            bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            if (medium) {
                double smooth = (original_context / wavelen - low_freq_factor) /
                                (high_freq_factor - low_freq_factor);
                scaled = (1.0 - smooth) * scaled / factor + smooth * scaled;
            }
            f = scaled;
        }
        inv_freq[i] = f;
    }
}

void loom_cpu_rope_table(float *cos_t, float *sin_t, const int32_t *positions, int64_t T,
                         const double *inv_freq, int32_t half) {
    for (int64_t t = 0; t < T; t++) {
        double p = (double)positions[t];
        for (int32_t i = 0; i < half; i++) {
            double a = p * inv_freq[i];
            cos_t[t * half + i] = (float)cos(a);
            sin_t[t * half + i] = (float)sin(a);
        }
    }
}

void loom_cpu_rope_apply(float *x, int64_t ldx, int64_t T, int32_t n_heads, int32_t head_dim,
                         const float *cos_t, const float *sin_t) {
    int32_t half = head_dim / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos_t + t * half;
        const float *s = sin_t + t * half;
        for (int32_t h = 0; h < n_heads; h++) {
            float *a = x + t * ldx + (int64_t)h * head_dim;
            float *b = a + half;
            for (int32_t i = 0; i < half; i++) {
                float x0 = a[i], x1 = b[i];
                a[i] = x0 * c[i] - x1 * s[i];
                b[i] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}
