/* A CPython 3.14 extension module compiled for wasm32-wasi: what a package built
 * with wasi-sdk ships as `NAME.cpython-314-wasm32-wasi.so`. tests/eryx_envs.rs uploads
 * it in a wheel (build.sh) to an eryx environment and calls it.
 *
 * It declares the part of CPython's stable ABI it uses itself, as bindings from other
 * languages do, instead of including Python.h: CPython's headers are configured per
 * target, and no Debian package carries them configured for wasm32-wasi. The layouts
 * below are those of Include/object.h, methodobject.h and moduleobject.h on a 32-bit
 * target. MODULE (the module's name) is set by build.sh. */

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)

typedef long Py_ssize_t;
typedef struct _object {
    Py_ssize_t ob_refcnt;
    void *ob_type;
} PyObject;
typedef PyObject *(*PyCFunction)(PyObject *, PyObject *);
typedef struct {
    const char *ml_name;
    PyCFunction ml_meth;
    int ml_flags;
    const char *ml_doc;
} PyMethodDef;
typedef struct {
    PyObject ob_base;
    PyObject *(*m_init)(void);
    Py_ssize_t m_index;
    PyObject *m_copy;
} PyModuleDef_Base;
typedef struct {
    PyModuleDef_Base m_base;
    const char *m_name;
    const char *m_doc;
    Py_ssize_t m_size;
    PyMethodDef *m_methods;
    void *m_slots;
    void *m_traverse;
    void *m_clear;
    void *m_free;
} PyModuleDef;

#define METH_O 0x0008
#define METH_FASTCALL 0x0080
/* A static object's reference count, as PyModuleDef_HEAD_INIT sets it: immortal
 * (_Py_STATIC_IMMORTAL_INITIAL_REFCNT on a 32-bit target). */
#define IMMORTAL (7L << 28)
/* PYTHON_API_VERSION */
#define API_VERSION 1013

extern PyObject *PyModule_Create2(PyModuleDef *, int);
extern int PyModule_AddStringConstant(PyObject *, const char *, const char *);
extern PyObject *PyLong_FromLong(long);
extern long PyLong_AsLong(PyObject *);
extern PyObject *PyLong_FromUnsignedLongLong(unsigned long long);
extern int PyBytes_AsStringAndSize(PyObject *, char **, Py_ssize_t *);
extern PyObject *PyErr_Occurred(void);
extern void PyErr_SetString(PyObject *, const char *);
extern PyObject *PyExc_TypeError;
extern void Py_DecRef(PyObject *);

/* add(a, b): a + b as C longs (32 bits here), with Python's errors for bad arguments. */
static PyObject *add(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    (void)self;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "add() takes exactly 2 arguments");
        return 0;
    }
    long a = PyLong_AsLong(args[0]);
    if (a == -1 && PyErr_Occurred())
        return 0;
    long b = PyLong_AsLong(args[1]);
    if (b == -1 && PyErr_Occurred())
        return 0;
    return PyLong_FromLong(a + b);
}

/* fnv1a(data): the 64-bit FNV-1a hash of a bytes object, a loop of C over its bytes. */
static PyObject *fnv1a(PyObject *self, PyObject *arg) {
    (void)self;
    char *p;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &p, &len) < 0)
        return 0;
    unsigned long long h = 0xcbf29ce484222325ULL;
    for (Py_ssize_t i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ULL;
    }
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef methods[] = {
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL, "add(a, b): a + b, in C"},
    {"fnv1a", fnv1a, METH_O, "fnv1a(data): the 64-bit FNV-1a hash of bytes, in C"},
    {0, 0, 0, 0},
};

static PyModuleDef module = {
    {{IMMORTAL, 0}, 0, 0, 0},
    STR(MODULE),
    "An extension module compiled for wasm32-wasi.",
    -1,
    methods,
    0, 0, 0, 0,
};

__attribute__((visibility("default"))) PyObject *CAT(PyInit_, MODULE)(void) {
    PyObject *m = PyModule_Create2(&module, API_VERSION);
    if (m && PyModule_AddStringConstant(m, "compiled_for", "wasm32-wasi") < 0) {
        Py_DecRef(m);
        return 0;
    }
    return m;
}
