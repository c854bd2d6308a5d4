/* onebit's encode sweep of one block in one pass over memory (AVX2), for primitives/codecs/sign_kernel.py.
 *
 * The NumPy sweep (primitives/codecs/sign.py) makes about nine passes over each cache-sized block: decode the
 * incoming payload, add it, decode the deferred residual's payload, subtract, add, compare, pack, abs, and the
 * 64-row lane sums of block_sum.  This does the same float32 operations, in the same order, element by element:
 *
 *     v = t0[k] + t1[k] + ... (left to right) the terms: an array, or a pending merge of at most one array and
 *                                            onebit payloads (t[k] = bit ? -s : s) in the merge's order
 *     v = v / divisor                        the pending merge's divisor, if not 1
 *     v = v + addend[k]                      an error-feedback residual, or
 *     v = v + (corrected[k] - (bit ? -r : r))  a deferred one
 *     out[k] = v;  sign bit (v < 0) packed as np.packbits does (first element in the high bit)
 *     lanes[k % L] += |v|                    block_sum's 64 rows of L = m/64 elements, added row after row
 *
 * so every result, bit and lane sum equals NumPy's (tests/primitives/test_sign_kernel.py holds it).  The caller
 * sums the lanes (NumPy's pairwise reduce) and the ragged tail.  No FMA contraction, no fast-math: IEEE float32
 * adds, subtracts and divides as NumPy's loops do them.  Compiled for AVX2 through a target attribute and used
 * only where the CPU has it (available()); elsewhere the NumPy sweep runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_TERMS 64 /* a merge of more terms (a server of more than 64 workers) runs NumPy's sweep */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* 8 decoded floats of one payload byte: +s where the bit is 0, -s (the sign bit flipped) where it is 1. */
__attribute__((target("avx2"))) static inline __m256 decode8(uint8_t byte, __m256 scale) {
    const __m256i bit = _mm256_setr_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(byte), bit), bit);
    return _mm256_xor_ps(scale, _mm256_castsi256_ps(_mm256_and_si256(set, _mm256_set1_epi32((int)0x80000000u))));
}

typedef struct {
    int terms;                         /* 1..MAX_TERMS, in the merge's order */
    int array_at;                      /* the array term's position, or -1 (payloads only) */
    const float *array;
    const uint8_t *payload[MAX_TERMS]; /* at the other positions: the payload's bits */
    float scale[MAX_TERMS];
    float divisor;
    int addend_kind; /* 0: none, 1: array, 2: deferred (corrected - decode) */
    const float *addend;
    const uint8_t *residual_bits;
    float residual_scale;
    float *out; /* NULL: not written (a plain encode) */
    uint8_t *bits;
    float *lanes;
    float *magnitudes; /* NULL where L is a multiple of 8; else n floats of scratch */
    Py_ssize_t n;      /* a multiple of 64, at least 128: L = n / 64 >= 2 lanes */
} Sweep;

__attribute__((target("avx2"))) static void sweep_avx2(const Sweep *a) {
    const Py_ssize_t n = a->n, lanes = n / 64;
    __m256 scale[MAX_TERMS];
    for (int t = 0; t < a->terms; t++) scale[t] = _mm256_set1_ps(a->scale[t]);
    const __m256 residual = _mm256_set1_ps(a->residual_scale);
    const __m256 divisor = _mm256_set1_ps(a->divisor), zero = _mm256_setzero_ps();
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i reverse = _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0); /* lane 0 into movemask's bit 7 */
    for (Py_ssize_t j = 0; j < lanes; j++) a->lanes[j] = 0.0f;
    Py_ssize_t j = 0;
    for (Py_ssize_t k = 0; k < n; k += 8) {
        __m256 v = a->array_at == 0 ? _mm256_loadu_ps(a->array + k) : decode8(a->payload[0][k >> 3], scale[0]);
        for (int t = 1; t < a->terms; t++)
            v = _mm256_add_ps(v, t == a->array_at ? _mm256_loadu_ps(a->array + k)
                                                  : decode8(a->payload[t][k >> 3], scale[t]));
        if (a->divisor != 1.0f) v = _mm256_div_ps(v, divisor);
        if (a->addend_kind == 1) {
            v = _mm256_add_ps(v, _mm256_loadu_ps(a->addend + k));
        } else if (a->addend_kind == 2) {
            __m256 r = _mm256_sub_ps(_mm256_loadu_ps(a->addend + k), decode8(a->residual_bits[k >> 3], residual));
            v = _mm256_add_ps(v, r);
        }
        if (a->out) _mm256_storeu_ps(a->out + k, v);
        __m256 negative = _mm256_cmp_ps(v, zero, _CMP_LT_OQ); /* NaN: false, as NumPy's less */
        a->bits[k >> 3] = (uint8_t)_mm256_movemask_ps(_mm256_permutevar8x32_ps(negative, reverse));
        if (a->magnitudes) {
            _mm256_storeu_ps(a->magnitudes + k, _mm256_and_ps(v, magnitude));
        } else { /* L a multiple of 8: these 8 elements are lanes j..j+7 of one row */
            __m256 sum = _mm256_add_ps(_mm256_loadu_ps(a->lanes + j), _mm256_and_ps(v, magnitude));
            _mm256_storeu_ps(a->lanes + j, sum);
            j += 8;
            if (j == lanes) j = 0;
        }
    }
    if (a->magnitudes) { /* rows of L that straddle vectors: add them row after row, in cache */
        for (Py_ssize_t row = 0; row < 64; row++) {
            const float *m = a->magnitudes + row * lanes;
            Py_ssize_t i = 0;
            for (; i + 8 <= lanes; i += 8)
                _mm256_storeu_ps(a->lanes + i, _mm256_add_ps(_mm256_loadu_ps(a->lanes + i), _mm256_loadu_ps(m + i)));
            for (; i < lanes; i++) a->lanes[i] += m[i];
        }
    }
}
#endif

static int has_avx2(void) {
#ifdef HAVE_AVX2_PATH
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static PyObject *available(PyObject *self, PyObject *unused) { return PyBool_FromLong(has_avx2()); }

/* sweep(terms, array_at, scales, divisor, addend_kind, addend, residual_bits, residual_scale, out, bits, lanes,
 *       magnitudes): ``terms`` a tuple of buffers in the merge's order (the float32 array at ``array_at``, payload
 *       bits elsewhere), ``scales`` a tuple of floats (the payloads' scales; any float at ``array_at``); buffers
 *       C-contiguous, an unused one empty; n, the block's length, a multiple of 64, at least 128. */
static PyObject *sweep(PyObject *self, PyObject *args) {
    PyObject *terms, *scales;
    int array_at, addend_kind;
    float divisor, residual_scale;
    Py_buffer addend, residual_bits, out, bits, lanes, magnitudes, term[MAX_TERMS];
    if (!PyArg_ParseTuple(args, "O!iO!fiy*y*fw*w*w*w*", &PyTuple_Type, &terms, &array_at, &PyTuple_Type, &scales,
                          &divisor, &addend_kind, &addend, &residual_bits, &residual_scale, &out, &bits, &lanes,
                          &magnitudes))
        return NULL;
    const Py_ssize_t k = PyTuple_GET_SIZE(terms), n = bits.len * 8, f = (Py_ssize_t)sizeof(float);
    const int straddle = (n / 64) % 8 != 0;
    int held = 0, ok = k >= 1 && k <= MAX_TERMS && PyTuple_GET_SIZE(scales) == k && array_at >= -1 && array_at < k;
    for (; ok && held < k; held++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(terms, held), &term[held], PyBUF_C_CONTIGUOUS) < 0) break;
        ok = term[held].len == (held == array_at ? n * f : n / 8);
    }
    ok = ok && held == k && !PyErr_Occurred();
    float scale[MAX_TERMS];
    for (Py_ssize_t t = 0; ok && t < k; t++) {
        scale[t] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(scales, t));
        ok = !PyErr_Occurred();
    }
    if (ok && (!has_avx2() || n % 64 != 0 || n < 128 || lanes.len != n / 64 * f || (addend_kind && addend.len != n * f) ||
               (addend_kind == 2 && residual_bits.len != n / 8) || (out.len && out.len != n * f) ||
               (straddle && magnitudes.len != n * f))) {
        ok = 0;
    }
    if (!ok && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "sign sweep kernel: needs AVX2, 1 to 64 terms (at most one array) and a "
                                          "block of 128 or more floats, a multiple of 64, with buffers of its length");
#ifdef HAVE_AVX2_PATH
    if (ok) {
        Sweep a = {.terms = (int)k, .array_at = array_at, .array = array_at >= 0 ? term[array_at].buf : NULL,
                   .divisor = divisor, .addend_kind = addend_kind, .addend = addend.buf,
                   .residual_bits = residual_bits.buf, .residual_scale = residual_scale,
                   .out = out.len ? out.buf : NULL, .bits = bits.buf, .lanes = lanes.buf,
                   .magnitudes = straddle ? magnitudes.buf : NULL, .n = n};
        for (Py_ssize_t t = 0; t < k; t++) {
            a.payload[t] = t == array_at ? NULL : term[t].buf;
            a.scale[t] = scale[t];
        }
        Py_BEGIN_ALLOW_THREADS
        sweep_avx2(&a);
        Py_END_ALLOW_THREADS
    }
#endif
    for (int t = 0; t < held; t++) PyBuffer_Release(&term[t]);
    PyBuffer_Release(&addend);
    PyBuffer_Release(&residual_bits);
    PyBuffer_Release(&out);
    PyBuffer_Release(&bits);
    PyBuffer_Release(&lanes);
    PyBuffer_Release(&magnitudes);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU runs the kernel (AVX2)."},
    {"sweep", sweep, METH_VARARGS, "onebit's encode sweep of one block in one pass (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sign_sweep", "onebit's fused encode sweep (AVX2)", -1,
                                    methods};

PyMODINIT_FUNC PyInit__sign_sweep(void) { return PyModule_Create(&module); }
