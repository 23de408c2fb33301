/* The compiled fast path for cudashim's hot wrappers.
 *
 * Each type here is the C twin of a pure-Python wrapper and behaves the same; cudashim
 * uses the Python one where this module was not built or the pure_python setting is on
 * (cudashim/speedups.py chooses). What makes them cheap: no Python frame of their own,
 * vectorcall in and out, the translator's caches read directly, and the caller check
 * ("who asks") answered from a table keyed by code object pointer.
 *
 *   CallerCache     who asks: the caller's code object -> does its module hear the truth
 *   Rewriter        a callable's device arguments translated (patching/rewriter.py)
 *   TruthSwitch     torch.cuda functions: the real one for honest callers, ours otherwise
 *   IsCuda          the Tensor.is_cuda property (patches/tensors.py)
 *   DefaultDevice   Tensor.cuda(): a device argument that defaults to "cuda"
 *   NamedDevice     torch.device("cuda") through the class stand-in's __call__
 *   DtypeGate       a function with a filled kernel gap, called outside the gap
 *   HalfGate        a matmul under the float16 policy, called outside float16
 *   AtOnce          a float16 call of inference computed in the policy's dtype in one frame
 *   DeviceMemory    the storages a program put on the device, where that is host memory
 *   Stay            a move to where a move placed the tensor already: the tensor itself
 *   LengthGate      a norm or dot blocked past a length, called shorter
 *
 * and one function, not a wrapper: holding(), the search for references to a displaced
 * CUDA-only library at activation (cudashim/substitutes/finder.py).
 *
 * The types live in eight files: _speedups_callers.c (who asks: CallerCache, TruthSwitch,
 * IsCuda), _speedups_devices.c (device arguments: Rewriter, DefaultDevice, NamedDevice),
 * _speedups_gaps.c (DtypeGate), _speedups_precision.c (HalfGate), _speedups_at_once.c
 * (AtOnce), _speedups_memory.c (DeviceMemory), _speedups_residency.c (Stay) and
 * _speedups_reductions.c (LengthGate).
 * This one holds what they share and the module.
 */

#include "_speedups.h"

/* ------------------------------------------------------------------------------------ */
/* What every wrapper shares                                                             */
/* ------------------------------------------------------------------------------------ */

/* Methods bind as Python functions do (``Tensor.to`` patched with one of these). */
PyObject *bind_as_method(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

PyObject *wrapper_repr(PyObject *self)
{
    PyObject *dict = *(PyObject **)((char *)self + Py_TYPE(self)->tp_dictoffset);
    PyObject *name = dict != NULL ? PyDict_GetItemString(dict, "__qualname__") : NULL;
    if (name != NULL)
        return PyUnicode_FromFormat("<%s %U (compiled)>", Py_TYPE(self)->tp_name, name);
    return PyUnicode_FromFormat("<%s object at %p>", Py_TYPE(self)->tp_name, self);
}

PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL}
};

/* ------------------------------------------------------------------------------------ */
/* holding(modules, objects): which modules' namespaces hold one of the objects           */
/* ------------------------------------------------------------------------------------ */

/* The twin of cudashim/substitutes/finder.py:_holding, run once at activation where a CUDA-only
 * library imported before it is displaced by its stand-in: every module imported so far (a
 * thousand or more, some fifty thousand names) is searched by identity. Python spends an
 * integer object per name on ``id``; here each name costs one probe of a table of pointers
 * (open addressing, at most half full). */

static size_t pointer_slot(uintptr_t pointer, size_t mask)
{
    return (size_t)(((uint64_t)(pointer >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 20) & mask;
}

static PyObject *holding(PyObject *self, PyObject *args)
{
    PyObject *modules, *objects, *sequence, *result = NULL;
    uintptr_t *table = NULL;
    size_t size = 16, mask, slot;
    Py_ssize_t count, i;
    if (!PyArg_ParseTuple(args, "O!O:holding", &PyList_Type, &modules, &objects))
        return NULL;
    sequence = PySequence_Fast(objects, "holding() needs a sequence of objects");
    if (sequence == NULL)
        return NULL;
    count = PySequence_Fast_GET_SIZE(sequence);
    while (size < 2 * (size_t)count)
        size *= 2;
    mask = size - 1;
    table = PyMem_Calloc(size, sizeof(uintptr_t));      /* 0: an empty slot (no object is at 0) */
    if (table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < count; i++) {
        uintptr_t pointer = (uintptr_t)PySequence_Fast_GET_ITEM(sequence, i);
        for (slot = pointer_slot(pointer, mask); table[slot] != 0 && table[slot] != pointer;
             slot = (slot + 1) & mask)
            ;
        table[slot] = pointer;
    }
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    for (i = 0; i < PyList_GET_SIZE(modules); i++) {
        PyObject *module = PyList_GET_ITEM(modules, i), *key, *value;
        Py_ssize_t position = 0;
        int held = 0;
        if (!PyModule_Check(module))
            continue;
        /* PyModule_GetDict: borrowed, never NULL for a module */
        while (!held && PyDict_Next(PyModule_GetDict(module), &position, &key, &value)) {
            uintptr_t pointer = (uintptr_t)value;
            for (slot = pointer_slot(pointer, mask); table[slot] != 0; slot = (slot + 1) & mask) {
                if (table[slot] == pointer) {
                    held = 1;
                    break;
                }
            }
        }
        if (held && PyList_Append(result, module) < 0) {
            Py_CLEAR(result);
            goto done;
        }
    }
done:
    PyMem_Free(table);
    Py_DECREF(sequence);
    return result;
}

static PyMethodDef speedups_functions[] = {
    {"holding", holding, METH_VARARGS,
     "holding(modules, objects): the modules in the list whose namespace holds one of the objects."},
    {NULL}
};

/* ------------------------------------------------------------------------------------ */

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudashim._speedups",
    .m_doc = "The compiled fast path for cudashim's hot wrappers (see cudashim/speedups.py).",
    .m_size = -1,
    .m_methods = speedups_functions,
};

/* Whether this build has exactly the types of the table of twins (cudashim/tables/
 * compiled_twins.py): a build made for another table does not load, and the pure-Python
 * wrappers run in its place. 1, or 0 with ImportError set. */
static int matches_the_table(PyTypeObject **types, size_t count)
{
    PyObject *table = PyImport_ImportModule("cudashim.tables.compiled_twins"), *twins;
    Py_ssize_t expected;
    size_t i;
    if (table == NULL)
        return 0;
    twins = PyObject_GetAttrString(table, "TWINS");
    Py_DECREF(table);
    if (twins == NULL || !PyDict_Check(twins)) {
        Py_XDECREF(twins);
        PyErr_SetString(PyExc_ImportError, "cudashim._speedups: the table of twins has no TWINS dict");
        return 0;
    }
    expected = PyDict_GET_SIZE(twins);
    for (i = 0; i < count; i++) {
        const char *name = strrchr(types[i]->tp_name, '.') + 1;
        if (PyDict_GetItemString(twins, name) == NULL) {
            Py_DECREF(twins);
            PyErr_Format(PyExc_ImportError, "cudashim._speedups was built with %s, which the table "
                         "of twins does not name: rebuild cudashim", name);
            return 0;
        }
    }
    Py_DECREF(twins);
    if ((size_t)expected != count) {
        PyErr_Format(PyExc_ImportError, "cudashim._speedups was built with %zu types; the table of "
                     "twins names %zd: rebuild cudashim", count, expected);
        return 0;
    }
    return 1;
}

PyMODINIT_FUNC PyInit__speedups(void)
{
    PyTypeObject *types[] = {&CallerCacheType, &RewriterType, &TruthSwitchType, &IsCudaType,
                             &DefaultDeviceType, &NamedDeviceType, &DtypeGateType, &HalfGateType,
                             &AtOnceType, &DeviceMemoryType, &StayType, &SideDeviceType,
                             &LengthGateType};
    size_t count = sizeof(types) / sizeof(types[0]), i;
    PyObject *module;
    if (!matches_the_table(types, count) || !device_memory_init_names() || !residency_init_names())
        return NULL;
    module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    for (i = 0; i < count; i++) {
        const char *name = strrchr(types[i]->tp_name, '.') + 1;
        if (PyType_Ready(types[i]) < 0)
            goto error;
        Py_INCREF(types[i]);                 /* PyModule_AddObject steals one on success */
        if (PyModule_AddObject(module, name, (PyObject *)types[i]) < 0) {
            Py_DECREF(types[i]);
            goto error;
        }
    }
    return module;
error:
    Py_DECREF(module);
    return NULL;
}
