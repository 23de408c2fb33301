/* The compiled twin of kernels/gap_fill.py's filled functions.
 *
 *   DtypeGate   a function with a kernel gap: calls in a gap dtype go to the Python fill's
 *               widening, every other call to the function as it came
 *
 * A function with a gap (``torch.abs`` of a bool tensor on the CPU) is called far more often
 * outside its gap than in it. The Python fill costs a frame on every call; the gate forwards
 * the call (vectorcall) and tells calls in the gap as gap_fill.py does: by the op's refusal
 * until the first call in the gap, by the tensors' dtypes after it.
 */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *function;          /* the op itself */
    PyObject *fill;              /* the Python fill: widens, computes, narrows back */
    PyObject *dtypes;            /* tuple of the gap's torch.dtype objects (compared by identity) */
    PyTypeObject *tensor_type;   /* torch._C.TensorBase */
    char gap_seen;               /* called in its gap once: dtypes are read first from then on */
    PyObject *dict;
    vectorcallfunc vectorcall;
} DtypeGateObject;

static PyObject *dtype_name;     /* "dtype", interned */

/* 1 where value is a tensor in one of the gap's dtypes, 0 otherwise, -1 on error. */
static int in_gap(DtypeGateObject *self, PyObject *value)
{
    PyObject *dtype;
    Py_ssize_t i;
    int found = 0;
    if (!PyObject_TypeCheck(value, self->tensor_type))
        return 0;
    dtype = PyObject_GetAttr(value, dtype_name);
    if (dtype == NULL)
        return -1;
    for (i = 0; i < PyTuple_GET_SIZE(self->dtypes) && !found; i++)
        found = PyTuple_GET_ITEM(self->dtypes, i) == dtype;
    Py_DECREF(dtype);
    return found;
}

static PyObject *DtypeGate_vectorcall(DtypeGateObject *self, PyObject *const *args,
                                      size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t total = PyVectorcall_NARGS(nargsf) + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *result, *type, *value, *traceback;
    Py_ssize_t i;
    int found = 0;
    if (self->gap_seen) {
        for (i = 0; i < total && !found; i++)
            if ((found = in_gap(self, args[i])) < 0)
                return NULL;
        return PyObject_Vectorcall(found ? self->fill : self->function, args, nargsf, kwnames);
    }
    result = PyObject_Vectorcall(self->function, args, nargsf, kwnames);
    if (result != NULL || !PyErr_ExceptionMatches(PyExc_Exception))
        return result;
    PyErr_Fetch(&type, &value, &traceback);       /* the op's refusal, kept while we look */
    for (i = 0; i < total && !found; i++)
        found = in_gap(self, args[i]);
    if (found <= 0) {
        if (found < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, traceback);    /* not the gap: the op's own error */
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    self->gap_seen = 1;
    return PyObject_Vectorcall(self->fill, args, nargsf, kwnames);
}

static PyObject *DtypeGate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"function", "fill", "dtypes", "tensor_type", NULL};
    PyObject *function, *fill, *dtypes, *tensor_type;
    DtypeGateObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!:DtypeGate", keywords, &function, &fill,
                                     &PyTuple_Type, &dtypes, &PyType_Type, &tensor_type))
        return NULL;
    if (dtype_name == NULL && (dtype_name = PyUnicode_InternFromString("dtype")) == NULL)
        return NULL;
    self = (DtypeGateObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(function);
    Py_INCREF(fill);
    Py_INCREF(dtypes);
    Py_INCREF(tensor_type);
    self->function = function;
    self->fill = fill;
    self->dtypes = dtypes;
    self->tensor_type = (PyTypeObject *)tensor_type;
    self->vectorcall = (vectorcallfunc)DtypeGate_vectorcall;
    return (PyObject *)self;
}

static int DtypeGate_traverse(DtypeGateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->function);
    Py_VISIT(self->fill);
    Py_VISIT(self->dtypes);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->dict);
    return 0;
}

static int DtypeGate_clear(DtypeGateObject *self)
{
    Py_CLEAR(self->function);
    Py_CLEAR(self->fill);
    Py_CLEAR(self->dtypes);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->dict);
    return 0;
}

static void DtypeGate_dealloc(DtypeGateObject *self)
{
    PyObject_GC_UnTrack(self);
    DtypeGate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef DtypeGate_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(DtypeGateObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(DtypeGateObject, dict), READONLY},
    {"function", T_OBJECT, offsetof(DtypeGateObject, function), READONLY},
    {"fill", T_OBJECT, offsetof(DtypeGateObject, fill), READONLY},
    {"dtypes", T_OBJECT, offsetof(DtypeGateObject, dtypes), READONLY},
    {"gap_seen", T_BOOL, offsetof(DtypeGateObject, gap_seen), READONLY},
    {NULL}
};

PyTypeObject DtypeGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.DtypeGate",
    .tp_basicsize = sizeof(DtypeGateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "DtypeGate(function, fill, dtypes, tensor_type): calls with a tensor argument in one of\n"
              "dtypes go to fill, every other call to function (see cudashim/kernels/gap_fill.py)",
    .tp_new = DtypeGate_new,
    .tp_traverse = (traverseproc)DtypeGate_traverse,
    .tp_clear = (inquiry)DtypeGate_clear,
    .tp_dealloc = (destructor)DtypeGate_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(DtypeGateObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(DtypeGateObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = DtypeGate_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};
