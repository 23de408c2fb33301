/* The compiled twin of patches/reductions.py's gate.
 *
 *   LengthGate   a norm or dot cudashim blocks past a length: shorter calls go to torch's
 *                function as they came, the rest to the Python twin, which decides
 *
 * Nearly every norm a program takes is short (a layer's weight, F.normalize over a row): the
 * Python twin would cost each a frame and an argument parse, about 350 ns on a 1.5 us call.
 * The gate reads the element counts of the leading positional tensors and forwards the call
 * (vectorcall) where none reaches the length; it never blocks anything itself.
 */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *function;          /* torch's own */
    PyObject *python;            /* the Python twin: blocks where the call is one to block */
    Py_ssize_t length;           /* the shortest leading tensor the twin may block */
    Py_ssize_t leading;          /* how many leading positionals are looked at */
    PyTypeObject *tensor_type;   /* torch._C.TensorBase */
    PyObject *dict;
    vectorcallfunc vectorcall;
} LengthGateObject;

static PyObject *numel_name;     /* "numel", interned */

/* 1 where a leading positional tensor has length elements or more (or the call has none to
 * look at: the twin judges), 0 where every one is shorter, -1 on error. */
static int reaches(LengthGateObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i, looked = 0;
    for (i = 0; i < nargs && i < self->leading; i++) {
        PyObject *count;
        Py_ssize_t n;
        if (!PyObject_TypeCheck(args[i], self->tensor_type))
            continue;
        count = PyObject_CallMethodNoArgs(args[i], numel_name);
        if (count == NULL)
            return -1;
        n = PyLong_AsSsize_t(count);
        Py_DECREF(count);
        if (n == -1 && PyErr_Occurred())
            return -1;
        if (n >= self->length)
            return 1;
        looked++;
    }
    return looked == 0;
}

static PyObject *LengthGate_vectorcall(LengthGateObject *self, PyObject *const *args,
                                       size_t nargsf, PyObject *kwnames)
{
    int long_call = reaches(self, args, PyVectorcall_NARGS(nargsf));
    if (long_call < 0)
        return NULL;
    return PyObject_Vectorcall(long_call ? self->python : self->function, args, nargsf, kwnames);
}

static PyObject *LengthGate_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"function", "python", "length", "leading", "tensor_type", NULL};
    PyObject *function, *python, *tensor_type;
    Py_ssize_t length, leading;
    LengthGateObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOnnO!:LengthGate", keywords, &function, &python,
                                     &length, &leading, &PyType_Type, &tensor_type))
        return NULL;
    if (leading < 1) {
        PyErr_SetString(PyExc_ValueError, "LengthGate looks at one leading positional or more");
        return NULL;
    }
    if (numel_name == NULL && (numel_name = PyUnicode_InternFromString("numel")) == NULL)
        return NULL;
    self = (LengthGateObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(function);
    Py_INCREF(python);
    Py_INCREF(tensor_type);
    self->function = function;
    self->python = python;
    self->length = length;
    self->leading = leading;
    self->tensor_type = (PyTypeObject *)tensor_type;
    self->vectorcall = (vectorcallfunc)LengthGate_vectorcall;
    return (PyObject *)self;
}

static int LengthGate_traverse(LengthGateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->function);
    Py_VISIT(self->python);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->dict);
    return 0;
}

static int LengthGate_clear(LengthGateObject *self)
{
    Py_CLEAR(self->function);
    Py_CLEAR(self->python);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->dict);
    return 0;
}

static void LengthGate_dealloc(LengthGateObject *self)
{
    PyObject_GC_UnTrack(self);
    LengthGate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef LengthGate_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(LengthGateObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(LengthGateObject, dict), READONLY},
    {"function", T_OBJECT, offsetof(LengthGateObject, function), READONLY},
    {"python", T_OBJECT, offsetof(LengthGateObject, python), READONLY},
    {"length", T_PYSSIZET, offsetof(LengthGateObject, length), READONLY},
    {"leading", T_PYSSIZET, offsetof(LengthGateObject, leading), READONLY},
    {NULL}
};

PyTypeObject LengthGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.LengthGate",
    .tp_basicsize = sizeof(LengthGateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "LengthGate(function, python, length, leading, tensor_type): calls whose leading\n"
              "positional tensors all have fewer than length elements go to function, the rest to\n"
              "python (see cudashim/patches/reductions.py)",
    .tp_new = LengthGate_new,
    .tp_traverse = (traverseproc)LengthGate_traverse,
    .tp_clear = (inquiry)LengthGate_clear,
    .tp_dealloc = (destructor)LengthGate_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(LengthGateObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(LengthGateObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = LengthGate_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};
