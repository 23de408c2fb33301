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
 *
 * The types live in two files: _speedups_callers.c (who asks: CallerCache, TruthSwitch,
 * IsCuda) and _speedups_devices.c (device arguments: Rewriter, DefaultDevice, NamedDevice).
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

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudashim._speedups",
    .m_doc = "The compiled fast path for cudashim's hot wrappers (see cudashim/speedups.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    PyTypeObject *types[] = {&CallerCacheType, &RewriterType, &TruthSwitchType, &IsCudaType,
                             &DefaultDeviceType, &NamedDeviceType};
    PyObject *module = PyModule_Create(&speedups_module);
    size_t i;
    if (module == NULL)
        return NULL;
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
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
