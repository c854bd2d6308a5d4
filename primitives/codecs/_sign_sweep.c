/* onebit's encode sweep, and its merges, of one block in one pass over memory (AVX2), for
 * primitives/codecs/sign_kernel.py.
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
 * sums the lanes (NumPy's pairwise reduce) and the ragged tail.  merge() writes the first two lines' v alone: an
 * all-gather's decode-and-sum of payloads (NumPy: a decode and an add per payload).  No FMA contraction, no fast-math: IEEE float32
 * adds, subtracts and divides as NumPy's loops do them.  Compiled for AVX2 through a target attribute and used
 * only where the CPU has it (available()); elsewhere the NumPy sweep runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_TERMS 64 /* a merge of more terms (a server of more than 64 workers) runs NumPy's sweep */
/* Blocks of fewer floats (a few microseconds of work) run holding the GIL: letting it go lets a rank's other
 * threads take it, and taking it back then waits for them, which in small ops costs more than the work. */
#define GIL_FREE_MIN 16384

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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* 8 decoded floats of one payload byte: +s where the bit is 0, -s (the sign bit flipped) where it is 1. */
__attribute__((target("avx2"))) static inline __m256 decode8(uint8_t byte, __m256 scale) {
    const __m256i bit = _mm256_setr_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(byte), bit), bit);
    return _mm256_xor_ps(scale, _mm256_castsi256_ps(_mm256_and_si256(set, _mm256_set1_epi32((int)0x80000000u))));
}

/* Elements k..k+7 of the merge: its terms added left to right, then divided (as casync.primitives.merge.run_merge). */
__attribute__((target("avx2"))) static inline __m256 merged8(const Sweep *a, const __m256 *scale, __m256 divisor,
                                                            Py_ssize_t k) {
    __m256 v = a->array_at == 0 ? _mm256_loadu_ps(a->array + k) : decode8(a->payload[0][k >> 3], scale[0]);
    for (int t = 1; t < a->terms; t++)
        v = _mm256_add_ps(v, t == a->array_at ? _mm256_loadu_ps(a->array + k) : decode8(a->payload[t][k >> 3], scale[t]));
    return a->divisor != 1.0f ? _mm256_div_ps(v, divisor) : v;
}

/* The merge alone, into out: a decode-and-sum of payloads (an all-gather's, a one-way server's). */
__attribute__((target("avx2"))) static void merge_avx2(const Sweep *a) {
    __m256 scale[MAX_TERMS];
    for (int t = 0; t < a->terms; t++) scale[t] = _mm256_set1_ps(a->scale[t]);
    const __m256 divisor = _mm256_set1_ps(a->divisor);
    for (Py_ssize_t k = 0; k < a->n; k += 8) _mm256_storeu_ps(a->out + k, merged8(a, scale, divisor, k));
}

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
        __m256 v = merged8(a, scale, divisor, k);
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

#ifdef HAVE_AVX2_PATH
/* fn(a), with the GIL released where the block is long enough to be worth it (GIL_FREE_MIN). */
static void run(void (*fn)(const Sweep *), const Sweep *a) {
    if (a->n < GIL_FREE_MIN) {
        fn(a);
        return;
    }
    Py_BEGIN_ALLOW_THREADS
    fn(a);
    Py_END_ALLOW_THREADS
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

/* Acquire the merge's term buffers (``terms``: a tuple, the float32 array at ``array_at``, payload bits elsewhere)
 * and scales (a tuple of floats, any float at ``array_at``) for a block of ``n`` floats, into ``a``; ``*held``
 * buffers are acquired (release them whatever the result).  Returns 0 with an exception set where they do not fit. */
static int acquire_terms(PyObject *terms, int array_at, PyObject *scales, Py_ssize_t n, Py_buffer *term, int *held,
                         Sweep *a) {
    const Py_ssize_t k = PyTuple_GET_SIZE(terms);
    *held = 0;
    if (k < 1 || k > MAX_TERMS || PyTuple_GET_SIZE(scales) != k || array_at < -1 || array_at >= k) goto bad;
    for (; *held < k; (*held)++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(terms, *held), &term[*held], PyBUF_C_CONTIGUOUS) < 0) return 0;
        if (term[*held].len != (*held == array_at ? n * (Py_ssize_t)sizeof(float) : n / 8)) {
            (*held)++;
            goto bad;
        }
    }
    a->terms = (int)k;
    a->array_at = array_at;
    a->array = array_at >= 0 ? term[array_at].buf : NULL;
    for (Py_ssize_t t = 0; t < k; t++) {
        a->payload[t] = t == array_at ? NULL : term[t].buf;
        a->scale[t] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(scales, t));
        if (PyErr_Occurred()) return 0;
    }
    a->n = n;
    return 1;
bad:
    PyErr_SetString(PyExc_ValueError, "sign sweep kernel: 1 to 64 terms (at most one array) of the block's length");
    return 0;
}

static void release(Py_buffer *buffers, int count) {
    for (int i = 0; i < count; i++) PyBuffer_Release(&buffers[i]);
}

/* sweep(terms, array_at, scales, divisor, addend_kind, addend, residual_bits, residual_scale, out, bits, lanes,
 *       magnitudes): the encode sweep of a block of n = 8 * len(bits) floats (a multiple of 64, at least 128);
 *       buffers C-contiguous, an unused one empty. */
static PyObject *sweep(PyObject *self, PyObject *args) {
    PyObject *terms, *scales;
    int array_at, addend_kind, held = 0;
    float divisor, residual_scale;
    Py_buffer view[6], term[MAX_TERMS]; /* addend, residual bits, out, bits, lanes, magnitudes */
    Sweep a = {0};
    if (!PyArg_ParseTuple(args, "O!iO!fiy*y*fw*w*w*w*", &PyTuple_Type, &terms, &array_at, &PyTuple_Type, &scales,
                          &divisor, &addend_kind, &view[0], &view[1], &residual_scale, &view[2], &view[3], &view[4],
                          &view[5]))
        return NULL;
    const Py_ssize_t n = view[3].len * 8, f = (Py_ssize_t)sizeof(float);
    const int straddle = (n / 64) % 8 != 0;
    int ok = acquire_terms(terms, array_at, scales, n, term, &held, &a);
    if (ok && (!has_avx2() || n % 64 != 0 || n < 128 || view[4].len != n / 64 * f ||
               (addend_kind && view[0].len != n * f) || (addend_kind == 2 && view[1].len != n / 8) ||
               (view[2].len && view[2].len != n * f) || (straddle && view[5].len != n * f))) {
        PyErr_SetString(PyExc_ValueError, "sign sweep kernel: needs AVX2 and a block of 128 or more floats, a "
                                          "multiple of 64, with buffers of its length");
        ok = 0;
    }
#ifdef HAVE_AVX2_PATH
    if (ok) {
        a.divisor = divisor;
        a.addend_kind = addend_kind;
        a.addend = view[0].buf;
        a.residual_bits = view[1].buf;
        a.residual_scale = residual_scale;
        a.out = view[2].len ? view[2].buf : NULL;
        a.bits = view[3].buf;
        a.lanes = view[4].buf;
        a.magnitudes = straddle ? view[5].buf : NULL;
        run(sweep_avx2, &a);
    }
#endif
    release(term, held);
    release(view, 6);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* merge(terms, array_at, scales, divisor, out): the merge alone of a block of n = len(out) floats (a multiple of 8),
 * written into out. */
static PyObject *merge(PyObject *self, PyObject *args) {
    PyObject *terms, *scales;
    int array_at, held = 0;
    float divisor;
    Py_buffer out, term[MAX_TERMS];
    Sweep a = {0};
    if (!PyArg_ParseTuple(args, "O!iO!fw*", &PyTuple_Type, &terms, &array_at, &PyTuple_Type, &scales, &divisor, &out))
        return NULL;
    const Py_ssize_t n = out.len / (Py_ssize_t)sizeof(float);
    int ok = acquire_terms(terms, array_at, scales, n, term, &held, &a);
    if (ok && (!has_avx2() || n % 8 != 0 || n < 8)) {
        PyErr_SetString(PyExc_ValueError, "sign merge kernel: needs AVX2 and a block of a multiple of 8 floats");
        ok = 0;
    }
#ifdef HAVE_AVX2_PATH
    if (ok) {
        a.divisor = divisor;
        a.out = out.buf;
        run(merge_avx2, &a);
    }
#endif
    release(term, held);
    PyBuffer_Release(&out);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU runs the kernel (AVX2)."},
    {"sweep", sweep, METH_VARARGS, "onebit's encode sweep of one block in one pass (see the file's comment)."},
    {"merge", merge, METH_VARARGS, "A merge of onebit payloads (and at most one array) of one block, in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sign_sweep", "onebit's fused encode sweep (AVX2)", -1,
                                    methods};

PyMODINIT_FUNC PyInit__sign_sweep(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "MAX_TERMS", MAX_TERMS) < 0 ||
                      PyModule_AddIntConstant(m, "GIL_FREE_MIN", GIL_FREE_MIN) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
