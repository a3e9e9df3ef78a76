/* GELU and its derivative on the GPU, fp32: the erf form, or transformers'
 * tanh approximation (gelu_new, gelu_pytorch_tanh). Shared by gpt_neox's
 * MLP (ops_neox.cu) and Gemma's GeGLU (ops_gemma.cu); backend/cpu/ops.c
 * computes the same in double (the difference is below fp32 rounding of
 * the result). */
#ifndef MT_KERNELS_OPS_GELU_CUH
#define MT_KERNELS_OPS_GELU_CUH

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

template <bool TANH>
__device__ __forceinline__ float gelu_f(float x) {
    if (TANH) return 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

template <bool TANH>
__device__ __forceinline__ float gelu_grad_f(float x) {
    if (TANH) {
        float t = tanhf(GELU_K * (x + GELU_A * x * x * x));
        return 0.5f * (1.0f + t) +
               0.5f * x * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    }
    /* Phi(x) + x phi(x), phi the standard normal density */
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) +
           x * expf(-0.5f * x * x) * 0.39894228040143268f;
}

#endif
