/* The compiled fast path, device memory: DeviceMemory, the storages a program put on the device
 * where device memory is host memory (the twin of cudashim/device_memory.py:DeviceMemory).
 *
 * A constructor's tensor made on the device is counted at every such call, so counting it
 * must cost little: one call for the tensor's storage, one dict probe, and, for a new
 * storage, its size and a weak reference whose callback counts it off when torch frees it. */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    /* dict: weak reference to a storage -> its bytes. A weak reference hashes as its storage
     * (cached while it lives) and equals another to the same live storage, so a probe with
     * the storage's plain weak reference finds the entry, and the callback, handed the dead
     * one, removes it. */
    PyObject *storages;
    PyObject *freed;              /* the weak references' callback: this object's storage_freed */
    long long allocated, peak, allocations, allocations_peak;
    long long allocated_total, freed_total, allocation_count, free_count;
} DeviceMemoryObject;

static PyObject *untyped_storage_name, *nbytes_name, *holds_name;      /* interned */

/* The storage under ``tensor`` (a new reference); NULL with no error set where it has none
 * of its own (a subclass, a sparse tensor), as the Python twin skips them; NULL with an
 * error set for any other failure. */
static PyObject *storage_of(PyObject *tensor)
{
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, untyped_storage_name);
    if (storage == NULL && (PyErr_ExceptionMatches(PyExc_AttributeError) ||
                            PyErr_ExceptionMatches(PyExc_RuntimeError) ||
                            PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
                            PyErr_ExceptionMatches(PyExc_TypeError)))
        PyErr_Clear();
    return storage;
}

/* 1 where ``storage`` is counted, 0 where not, -1 with an error set. A storage no weak
 * reference points to is not counted (a constructor's, the common case): known without
 * making one to probe with. */
static int counted(DeviceMemoryObject *self, PyObject *storage)
{
    PyTypeObject *type = Py_TYPE(storage);
    PyObject *probe;
    int known;
    if (type->tp_weaklistoffset > 0 &&
            *(PyObject **)((char *)storage + type->tp_weaklistoffset) == NULL)
        return 0;
    probe = PyWeakref_NewRef(storage, NULL);
    if (probe == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();                 /* not weakly referable: never counted */
        return 0;
    }
    known = PyDict_Contains(self->storages, probe);
    Py_DECREF(probe);
    return known;
}

/* The weak references' callback: the storage is freed, so it is counted off. */
static PyObject *DeviceMemory_storage_freed(DeviceMemoryObject *self, PyObject *reference)
{
    PyObject *size_object;
    long long size;
    if (self->storages == NULL)
        Py_RETURN_NONE;
    size_object = PyDict_GetItemWithError(self->storages, reference);     /* borrowed */
    if (size_object == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    size = PyLong_AsLongLong(size_object);
    if (PyDict_DelItem(self->storages, reference) < 0)
        return NULL;
    self->allocated -= size;
    self->allocations -= 1;
    self->freed_total += size;
    self->free_count += 1;
    Py_RETURN_NONE;
}

static PyObject *DeviceMemory_add(DeviceMemoryObject *self, PyObject *tensor)
{
    PyObject *storage, *size_object = NULL, *reference = NULL;
    long long size;
    int known;
    storage = storage_of(tensor);
    if (storage == NULL)
        return PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
    known = counted(self, storage);
    if (known != 0) {
        if (known < 0)
            goto error;
        goto done;
    }
    size_object = PyObject_CallMethodNoArgs(storage, nbytes_name);
    if (size_object == NULL)
        goto error;
    size = PyLong_AsLongLong(size_object);
    if (size == -1 && PyErr_Occurred())
        goto error;
    reference = PyWeakref_NewRef(storage, self->freed);
    if (reference == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError))
            goto error;
        PyErr_Clear();                 /* not weakly referable: not counted, as in Python */
        goto done;
    }
    if (PyDict_SetItem(self->storages, reference, size_object) < 0)
        goto error;
    self->allocated += size;
    self->allocations += 1;
    self->allocated_total += size;
    self->allocation_count += 1;
    if (self->allocated > self->peak)
        self->peak = self->allocated;
    if (self->allocations > self->allocations_peak)
        self->allocations_peak = self->allocations;
done:
    Py_XDECREF(reference);
    Py_XDECREF(size_object);
    Py_DECREF(storage);
    Py_RETURN_NONE;
error:
    Py_XDECREF(reference);
    Py_XDECREF(size_object);
    Py_DECREF(storage);
    return NULL;
}

/* 1 where the storage under ``tensor`` is counted, 0 where not, -1 with an error set: holds()
 * for C callers (Tensor.device's twin asks it of every tensor of unknown side). */
int device_memory_holds(PyObject *memory, PyObject *tensor)
{
    PyObject *storage, *answer;
    int known;
    if (Py_TYPE(memory) != &DeviceMemoryType) {
        answer = PyObject_CallMethodOneArg(memory, holds_name, tensor);
        known = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        return known;
    }
    storage = storage_of(tensor);
    if (storage == NULL)
        return PyErr_Occurred() ? -1 : 0;
    known = counted((DeviceMemoryObject *)memory, storage);
    Py_DECREF(storage);
    return known;
}

static PyObject *DeviceMemory_holds(DeviceMemoryObject *self, PyObject *tensor)
{
    int known = device_memory_holds((PyObject *)self, tensor);
    if (known < 0)
        return NULL;
    return PyBool_FromLong(known);
}

static PyObject *DeviceMemory_reset_peak(DeviceMemoryObject *self, PyObject *unused)
{
    self->peak = self->allocated;
    self->allocations_peak = self->allocations;
    Py_RETURN_NONE;
}

static PyObject *DeviceMemory_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    DeviceMemoryObject *self;
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "DeviceMemory() takes no arguments");
        return NULL;
    }
    self = (DeviceMemoryObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->storages = PyDict_New();
    self->freed = PyObject_GetAttrString((PyObject *)self, "_storage_freed");
    if (self->storages == NULL || self->freed == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int DeviceMemory_traverse(DeviceMemoryObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->storages);
    Py_VISIT(self->freed);
    return 0;
}

static int DeviceMemory_clear(DeviceMemoryObject *self)
{
    Py_CLEAR(self->storages);
    Py_CLEAR(self->freed);
    return 0;
}

static void DeviceMemory_dealloc(DeviceMemoryObject *self)
{
    PyObject_GC_UnTrack(self);
    DeviceMemory_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef DeviceMemory_methods[] = {
    {"add", (PyCFunction)DeviceMemory_add, METH_O,
     "Count the storage under the tensor (once, however often it is added)."},
    {"holds", (PyCFunction)DeviceMemory_holds, METH_O, "Whether the storage under the tensor is counted."},
    {"reset_peak", (PyCFunction)DeviceMemory_reset_peak, METH_NOARGS, "The peaks become the current figures."},
    {"_storage_freed", (PyCFunction)DeviceMemory_storage_freed, METH_O,
     "A counted storage's weak-reference callback: counts it off."},
    {NULL}
};

static PyMemberDef DeviceMemory_members[] = {
    {"allocated", T_LONGLONG, offsetof(DeviceMemoryObject, allocated), READONLY},
    {"peak", T_LONGLONG, offsetof(DeviceMemoryObject, peak), READONLY},
    {"allocations", T_LONGLONG, offsetof(DeviceMemoryObject, allocations), READONLY},
    {"allocations_peak", T_LONGLONG, offsetof(DeviceMemoryObject, allocations_peak), READONLY},
    {"allocated_total", T_LONGLONG, offsetof(DeviceMemoryObject, allocated_total), READONLY},
    {"freed_total", T_LONGLONG, offsetof(DeviceMemoryObject, freed_total), READONLY},
    {"allocation_count", T_LONGLONG, offsetof(DeviceMemoryObject, allocation_count), READONLY},
    {"free_count", T_LONGLONG, offsetof(DeviceMemoryObject, free_count), READONLY},
    {NULL}
};

PyTypeObject DeviceMemoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.DeviceMemory",
    .tp_basicsize = sizeof(DeviceMemoryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "DeviceMemory(): bytes and storages counted on the device, each storage once, until "
              "torch frees it",
    .tp_new = DeviceMemory_new,
    .tp_traverse = (traverseproc)DeviceMemory_traverse,
    .tp_clear = (inquiry)DeviceMemory_clear,
    .tp_dealloc = (destructor)DeviceMemory_dealloc,
    .tp_methods = DeviceMemory_methods,
    .tp_members = DeviceMemory_members,
};

int device_memory_init_names(void)
{
    untyped_storage_name = PyUnicode_InternFromString("untyped_storage");
    nbytes_name = PyUnicode_InternFromString("nbytes");
    holds_name = PyUnicode_InternFromString("holds");
    return untyped_storage_name != NULL && nbytes_name != NULL && holds_name != NULL;
}
