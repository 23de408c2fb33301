/* The compiled twin of patches/precision.py's matmul wrapper.
 *
 *   HalfGate    a function of the matmul family under the float16 policy: calls whose
 *               leading tensor is float16 go to the policy, every other call to the
 *               function as it came; a call giving no tensor by position before the leading
 *               one's place but some by keyword (F.linear(input=x, weight=w)) to the Python
 *               wrapper, which finds the leading tensor by its name
 *
 * The matmul family (F.linear, torch.mm, Tensor.__matmul__...) is called in every layer of
 * every step, and nearly always outside float16 where the policy widens float16. The Python
 * wrapper costs a frame and its argument tuple on every call; the gate reads the leading
 * tensor's dtype and forwards the call (vectorcall). A call torch refuses (mixed dtypes) is
 * handed to the policy's reconciliation only inside a region the policy runs in float32,
 * as the Python wrapper does; elsewhere torch's own error stands.
 */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *function;          /* the op itself */
    PyObject *widened;           /* the policy's call for float16 inputs */
    PyObject *reconciled;        /* the policy's call for mixed dtypes in a float32 region */
    PyObject *regions;           /* the policy's float32 regions (their depth in this thread) */
    PyObject *half;              /* torch.float16, compared by identity */
    Py_ssize_t first;            /* where the leading tensor is (einsum: after the equation) */
    PyObject *keyworded;         /* the Python wrapper, for calls naming their tensors (or None) */
    PyObject *dict;
    vectorcallfunc vectorcall;
} HalfGateObject;

static PyObject *dtype_name, *depth_name;     /* "dtype", "depth", interned */

/* 1 where the call's leading tensor (or the first of a list or tuple of operands there) is
 * float16, 0 where it is not or there is none, -1 on error. */
static int leads_in_half(HalfGateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *leading, *dtype;
    int half;
    if (nargs <= self->first)
        return 0;
    leading = args[self->first];
    if ((PyList_CheckExact(leading) || PyTuple_CheckExact(leading)) && PySequence_Size(leading) > 0)
        leading = PyList_CheckExact(leading) ? PyList_GET_ITEM(leading, 0) : PyTuple_GET_ITEM(leading, 0);
    dtype = PyObject_GetAttr(leading, dtype_name);
    if (dtype == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    half = dtype == self->half;
    Py_DECREF(dtype);
    return half;
}

/* Whether a float32 region is open in this thread: 1, 0, or -1 on error. */
static int in_float32_region(HalfGateObject *self)
{
    PyObject *depth = PyObject_GetAttr(self->regions, depth_name);
    int open;
    if (depth == NULL)
        return -1;
    open = PyObject_IsTrue(depth);
    Py_DECREF(depth);
    return open;
}

static PyObject *HalfGate_vectorcall(HalfGateObject *self, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames)
{
    PyObject *result, *type, *value, *traceback;
    int found;
    if (PyVectorcall_NARGS(nargsf) <= self->first && kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0
            && self->keyworded != Py_None)
        return PyObject_Vectorcall(self->keyworded, args, nargsf, kwnames);
    found = leads_in_half(self, args, PyVectorcall_NARGS(nargsf));
    if (found < 0)
        return NULL;
    if (found)
        return PyObject_Vectorcall(self->widened, args, nargsf, kwnames);
    result = PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    if (result != NULL || !PyErr_ExceptionMatches(PyExc_RuntimeError))
        return result;
    PyErr_Fetch(&type, &value, &traceback);       /* torch's refusal, kept while we look */
    found = in_float32_region(self);
    if (found <= 0) {
        if (found < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);    /* no region: torch's own error */
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return PyObject_Vectorcall(self->reconciled, args, nargsf, kwnames);
}

static PyObject *HalfGate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"function", "widened", "reconciled", "regions", "half", "first",
                               "keyworded", NULL};
    PyObject *function, *widened, *reconciled, *regions, *half, *keyworded = Py_None;
    Py_ssize_t first;
    HalfGateObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOn|O:HalfGate", keywords, &function, &widened,
                                     &reconciled, &regions, &half, &first, &keyworded))
        return NULL;
    if (first < 0) {
        PyErr_SetString(PyExc_ValueError, "HalfGate: first must be 0 or more");
        return NULL;
    }
    if (dtype_name == NULL && (dtype_name = PyUnicode_InternFromString("dtype")) == NULL)
        return NULL;
    if (depth_name == NULL && (depth_name = PyUnicode_InternFromString("depth")) == NULL)
        return NULL;
    self = (HalfGateObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(function);
    Py_INCREF(widened);
    Py_INCREF(reconciled);
    Py_INCREF(regions);
    Py_INCREF(half);
    Py_INCREF(keyworded);
    self->function = function;
    self->widened = widened;
    self->reconciled = reconciled;
    self->regions = regions;
    self->half = half;
    self->first = first;
    self->keyworded = keyworded;
    self->vectorcall = (vectorcallfunc)HalfGate_vectorcall;
    return (PyObject *)self;
}

static int HalfGate_traverse(HalfGateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->function);
    Py_VISIT(self->widened);
    Py_VISIT(self->reconciled);
    Py_VISIT(self->regions);
    Py_VISIT(self->half);
    Py_VISIT(self->keyworded);
    Py_VISIT(self->dict);
    return 0;
}

static int HalfGate_clear(HalfGateObject *self)
{
    Py_CLEAR(self->function);
    Py_CLEAR(self->widened);
    Py_CLEAR(self->reconciled);
    Py_CLEAR(self->regions);
    Py_CLEAR(self->half);
    Py_CLEAR(self->keyworded);
    Py_CLEAR(self->dict);
    return 0;
}

static void HalfGate_dealloc(HalfGateObject *self)
{
    PyObject_GC_UnTrack(self);
    HalfGate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef HalfGate_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(HalfGateObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(HalfGateObject, dict), READONLY},
    {"function", T_OBJECT, offsetof(HalfGateObject, function), READONLY},
    {"widened", T_OBJECT, offsetof(HalfGateObject, widened), READONLY},
    {"reconciled", T_OBJECT, offsetof(HalfGateObject, reconciled), READONLY},
    {"first", T_PYSSIZET, offsetof(HalfGateObject, first), READONLY},
    {NULL}
};

PyTypeObject HalfGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.HalfGate",
    .tp_basicsize = sizeof(HalfGateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "HalfGate(function, widened, reconciled, regions, half, first, keyworded=None): calls\n"
              "whose leading tensor is float16 go to widened, every other call to function; a call\n"
              "function refuses goes to reconciled inside a float32 region; a call with no tensor\n"
              "by position up to first and keywords, to keyworded where given (see\n"
              "cudashim/patches/precision.py)",
    .tp_new = HalfGate_new,
    .tp_traverse = (traverseproc)HalfGate_traverse,
    .tp_clear = (inquiry)HalfGate_clear,
    .tp_dealloc = (destructor)HalfGate_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(HalfGateObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(HalfGateObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = HalfGate_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};
