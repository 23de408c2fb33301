/* The compiled fast path, moves where device memory is host memory: Stay, the twin of the
 * moves cudashim/patches/residency.py wraps (Tensor.to, Tensor.cpu, Tensor.cuda).
 *
 * A move to where a move already placed the tensor returns it, as on CUDA; that is the
 * common call (``batch.to(device)`` on a tensor already there, ``loss.cpu()`` on a host
 * copy), so it is answered here: one dict probe of the residency's sides and the tensor back
 * (torch's move is asked first only where its other arguments could change the answer).
 * The copy a move makes of a plain tensor (``batch.cuda()``, ``weights.cpu()`` for a snapshot)
 * is made here too, placed as the Python twin places it; every other outcome (a result torch
 * made, a tensor whose storage is counted as the device's, a module's move under way, a
 * subclass) is the Python twin's ``moved`` to decide, as without this type. */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *move;       /* torch's move (or the compiled Tensor.cuda beneath this one) */
    PyObject *fallback;   /* the Python twin: the calls whose destination this type cannot read */
    PyObject *moved;      /* moved(tensor, result, side): Residency.moved for this API */
    PyObject *sides;      /* Residency.sides: id(tensor) -> (side, weak reference) */
    PyObject *side;       /* this API's fixed side, or None: read from the device argument */
    PyObject *device;     /* the target's device object */
    PyObject *named;      /* the translator's named devices: "cpu" -> the program's torch.device("cpu") */
    PyObject *tensor_type;      /* torch._C.TensorBase: to(other) takes the other's side */
    PyObject *plain_types;      /* (torch.Tensor, torch.nn.Parameter): moved by torch alone */
    PyObject *watchers;   /* None where not known, else callables: does a torch function mode,
                             or a JIT trace, see torch's calls now */
    PyObject *device_side, *host_side, *pinned_side;
    PyObject *copying;    /* None (the Python twin copies), or (memory or None, the residency's
                             per-thread module moves, torch.strided, counted(side) or None) */
    PyObject *dict;
    vectorcallfunc vectorcall;
} StayObject;

static PyObject *device_name, *cpu_name, *cpu_prefix;              /* interned */
static PyObject *clone_name, *holds_name, *add_name, *layout_name, *moving_module_name, *in_place_name,
                *is_cpu_name;

/* The side a device argument names (borrowed): the device's, the host's, or None where it
 * names neither (a dtype, a device read off a tensor): torch's answer stands. NULL where
 * only the Python twin can tell (another tensor), or with an error set. */
static PyObject *side_of_spec(StayObject *self, PyObject *spec)
{
    if (spec == self->device)
        return self->device_side;
    if (PyUnicode_CheckExact(spec)) {
        if (PyUnicode_CompareWithASCIIString(spec, "cpu") == 0 ||
            PyUnicode_Tailmatch(spec, cpu_prefix, 0, 4, -1) == 1)
            return self->host_side;
        return Py_None;
    }
    if (PyObject_TypeCheck(spec, (PyTypeObject *)self->tensor_type))
        return NULL;
    if (spec == PyDict_GetItemWithError(self->named, cpu_name))
        return self->host_side;
    return PyErr_Occurred() ? NULL : Py_None;
}

/* The device argument of ``to(device, ...)`` or ``to(device=...)`` (borrowed), or NULL. */
static PyObject *device_argument(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t i, count;
    if (nargs >= 2)
        return args[1];
    if (kwnames == NULL)
        return NULL;
    count = PyTuple_GET_SIZE(kwnames);
    for (i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == device_name || PyUnicode_Compare(name, device_name) == 0)
            return args[nargs + i];
    }
    return NULL;
}

/* 1 where a move placed ``tensor`` on ``side`` (or on pinned host memory, for the host),
 * 0 where not or not known here, -1 with an error set. */
static int placed_on(StayObject *self, PyObject *tensor, PyObject *side)
{
    PyObject *key = PyLong_FromVoidPtr(tensor), *entry, *known;
    if (key == NULL)
        return -1;
    entry = PyDict_GetItemWithError(self->sides, key);           /* borrowed */
    Py_DECREF(key);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 1)
        return 0;
    known = PyTuple_GET_ITEM(entry, 0);
    return known == side || (side == self->host_side && known == self->pinned_side);
}

/* Whether a torch function mode or a JIT trace sees torch's calls now: 1, 0, or -1 with an
 * error set. Where torch cannot say (no watchers), 1: torch's own path is taken. */
static int watched(StayObject *self)
{
    Py_ssize_t i;
    if (!PyTuple_Check(self->watchers))
        return 1;
    for (i = 0; i < PyTuple_GET_SIZE(self->watchers); i++) {
        PyObject *answer = PyObject_CallNoArgs(PyTuple_GET_ITEM(self->watchers, i));
        int seen;
        if (answer == NULL)
            return -1;
        seen = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (seen != 0)
            return seen;
    }
    return 0;
}

/* Whether ``spec`` names the one device of its side, not an index of it ("cpu:0" is another
 * device to torch, which copies there). */
static int names_the_device_itself(StayObject *self, PyObject *spec)
{
    PyObject *host;
    if (spec == self->device)
        return 1;
    if (PyUnicode_CheckExact(spec))
        return PyUnicode_CompareWithASCIIString(spec, "cpu") == 0;
    host = PyDict_GetItemWithError(self->named, cpu_name);
    if (host == NULL)
        PyErr_Clear();
    return host != NULL && spec == host;
}

/* Whether a move by its destination alone (``t.cuda()``, ``h.cpu()``, ``t.to("cuda")``) of
 * ``tensor`` to ``side`` is ``tensor`` itself, without asking torch: it is placed there, and
 * torch's move would return it, since where device memory is host memory there is one device
 * and every placed tensor is a host tensor. Only for a plain tensor or parameter (a subclass
 * moves itself), and while nothing watches torch's calls (a torch function mode sees every
 * call; a JIT trace records torch's move). 1, 0, or -1 with an error set. */
static int moves_to_itself(StayObject *self, PyObject *tensor, PyObject *side)
{
    int seen;
    if (PySequence_Contains(self->plain_types, (PyObject *)Py_TYPE(tensor)) != 1)
        return 0;
    seen = watched(self);
    if (seen != 0)
        return seen < 0 ? -1 : 0;
    return placed_on(self, tensor, side);
}

/* The weak reference's callback for a copy placed here (``Residency.place``'s ``forget``):
 * ``state`` is (sides, key); the entry goes with its tensor, unless a later one took its key. */
static PyObject *forget_placed(PyObject *state, PyObject *reference)
{
    PyObject *sides = PyTuple_GET_ITEM(state, 0), *key = PyTuple_GET_ITEM(state, 1);
    PyObject *entry = PyDict_GetItemWithError(sides, key);                  /* borrowed */
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2 && PyTuple_GET_ITEM(entry, 1) == reference
            && PyDict_DelItem(sides, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef forget_placed_def = {"forget", forget_placed, METH_O, NULL};

/* ``copy`` placed on ``side`` (``Residency.place``): known there by its sides entry, and
 * counted as device memory where it went to the device. 0, or -1 with an error set. */
static int place_copy(StayObject *self, PyObject *copy, PyObject *side, PyObject *memory)
{
    PyObject *key = PyLong_FromVoidPtr(copy), *state, *forget, *reference, *entry, *added;
    int failed;
    if (key == NULL)
        return -1;
    state = PyTuple_Pack(2, self->sides, key);
    forget = state == NULL ? NULL : PyCFunction_New(&forget_placed_def, state);
    Py_XDECREF(state);
    reference = forget == NULL ? NULL : PyWeakref_NewRef(copy, forget);
    Py_XDECREF(forget);
    entry = reference == NULL ? NULL : PyTuple_Pack(2, side, reference);
    Py_XDECREF(reference);
    failed = entry == NULL || PyDict_SetItem(self->sides, key, entry) < 0;
    Py_DECREF(key);
    Py_XDECREF(entry);
    if (failed)
        return -1;
    if (side != self->device_side || memory == Py_None)
        return 0;
    added = PyObject_CallMethodOneArg(memory, add_name, copy);
    Py_XDECREF(added);
    return added == NULL ? -1 : 0;
}

/* What a move of ``tensor`` to ``side`` returns where torch returned ``tensor`` itself and no
 * move placed it there: a copy of its own, made and placed here (``Residency.moved``, whose
 * every other outcome is left to it). NULL without an error where the Python twin decides,
 * NULL with one set on failure. */
static PyObject *copied_here(StayObject *self, PyObject *tensor, PyObject *side)
{
    PyObject *memory, *key, *entry, *answer, *copy;
    int yes;
    if (!PyTuple_Check(self->copying) || PyTuple_GET_SIZE(self->copying) != 4)
        return NULL;
    if (PySequence_Contains(self->plain_types, (PyObject *)Py_TYPE(tensor)) != 1)
        return NULL;                     /* a subclass moves itself; torch's answer stands */
    yes = watched(self);                 /* a graph being recorded moves as torch's code does */
    if (yes != 0)
        return NULL;
    /* cudashim's own moves, made in place on this thread (``Residency.in_place``) */
    answer = PyObject_GetAttr(PyTuple_GET_ITEM(self->copying, 1), in_place_name);
    yes = answer == NULL ? -1 : PyObject_IsTrue(answer);
    Py_XDECREF(answer);
    if (yes != 0)
        return NULL;
    memory = PyTuple_GET_ITEM(self->copying, 0);
    key = PyLong_FromVoidPtr(tensor);
    if (key == NULL)
        return NULL;
    entry = PyDict_GetItemWithError(self->sides, key);
    Py_DECREF(key);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        /* not placed: a view of counted device memory, or a module's own tensor mid-move,
         * is the twin's to answer */
        if (memory != Py_None) {
            answer = PyObject_CallMethodOneArg(memory, holds_name, tensor);
            yes = answer == NULL ? -1 : PyObject_IsTrue(answer);
            Py_XDECREF(answer);
            if (yes != 0)
                return NULL;
        }
        answer = PyObject_GetAttr(PyTuple_GET_ITEM(self->copying, 1), moving_module_name);
        yes = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (yes != 0)
            return NULL;
    }
    answer = PyObject_GetAttr(tensor, layout_name);
    if (answer == NULL)
        return NULL;
    yes = answer == PyTuple_GET_ITEM(self->copying, 2);
    Py_DECREF(answer);
    if (!yes)
        return NULL;                     /* sparse, nested: torch's answer stands */
    copy = PyObject_CallMethodNoArgs(tensor, clone_name);
    if (copy == NULL)
        return NULL;
    if (PyTuple_GET_ITEM(self->copying, 3) != Py_None) {
        answer = PyObject_CallOneArg(PyTuple_GET_ITEM(self->copying, 3), side);
        if (answer == NULL) {
            Py_DECREF(copy);
            return NULL;
        }
        Py_DECREF(answer);
    }
    if (place_copy(self, copy, side, memory) < 0)
        Py_CLEAR(copy);
    return copy;
}

static PyObject *Stay_vectorcall(StayObject *self, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *side = self->side, *result, *stack[3], *out;
    int placed;
    if (nargs < 1)
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    if (side == Py_None) {
        PyObject *spec = device_argument(args, nargs, kwnames);
        if (spec != NULL) {
            side = side_of_spec(self, spec);
            if (side == NULL && PyErr_Occurred())
                return NULL;
            if (side == NULL)
                return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
        }
    }
    if (side != Py_None && kwnames == NULL && (self->side == Py_None ?
            nargs == 2 && names_the_device_itself(self, args[1]) : nargs == 1)) {
        placed = moves_to_itself(self, args[0], side);
        if (placed != 0) {
            if (placed < 0)
                return NULL;
            Py_INCREF(args[0]);
            return args[0];
        }
        /* Nor is torch asked where the tensor is in host memory: its move would return the
         * tensor itself, of which this move is a copy. */
        out = PyObject_GetAttr(args[0], is_cpu_name);
        if (out == NULL)
            return NULL;
        placed = out == Py_True;
        Py_DECREF(out);
        if (placed) {
            out = copied_here(self, args[0], side);
            if (out != NULL || PyErr_Occurred())
                return out;
        }
    }
    result = PyObject_Vectorcall(self->move, args, nargsf, kwnames);
    if (result == NULL || side == Py_None)
        return result;
    if (result == args[0]) {
        placed = placed_on(self, args[0], side);
        if (placed != 0) {
            if (placed < 0)
                Py_CLEAR(result);
            return result;
        }
        out = copied_here(self, args[0], side);
        if (out != NULL || PyErr_Occurred()) {
            Py_DECREF(result);
            return out;
        }
    }
    stack[0] = args[0];
    stack[1] = result;
    stack[2] = side;
    out = PyObject_Vectorcall(self->moved, stack, 3, NULL);
    Py_DECREF(result);
    return out;
}

static PyObject *Stay_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"move", "fallback", "moved", "sides", "side", "device", "named",
                               "tensor_type", "device_side", "host_side", "pinned_side",
                               "plain_types", "watchers", "copying", NULL};
    PyObject *values[14];
    StayObject *self;
    int i;
    values[13] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!OOO!O!OOOO!O|O:Stay", keywords, &values[0],
                                     &values[1], &values[2], &PyDict_Type, &values[3], &values[4],
                                     &values[5], &PyDict_Type, &values[6], &PyType_Type, &values[7],
                                     &values[8], &values[9], &values[10], &PyTuple_Type, &values[11],
                                     &values[12], &values[13]))
        return NULL;
    self = (StayObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (i = 0; i < 14; i++)
        Py_INCREF(values[i]);
    self->move = values[0];
    self->fallback = values[1];
    self->moved = values[2];
    self->sides = values[3];
    self->side = values[4];
    self->device = values[5];
    self->named = values[6];
    self->tensor_type = values[7];
    self->device_side = values[8];
    self->host_side = values[9];
    self->pinned_side = values[10];
    self->plain_types = values[11];
    self->watchers = values[12];
    self->copying = values[13];
    self->vectorcall = (vectorcallfunc)Stay_vectorcall;
    return (PyObject *)self;
}

static int Stay_traverse(StayObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->move);
    Py_VISIT(self->fallback);
    Py_VISIT(self->moved);
    Py_VISIT(self->sides);
    Py_VISIT(self->side);
    Py_VISIT(self->device);
    Py_VISIT(self->named);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->device_side);
    Py_VISIT(self->host_side);
    Py_VISIT(self->pinned_side);
    Py_VISIT(self->plain_types);
    Py_VISIT(self->watchers);
    Py_VISIT(self->copying);
    Py_VISIT(self->dict);
    return 0;
}

static int Stay_clear(StayObject *self)
{
    Py_CLEAR(self->move);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->moved);
    Py_CLEAR(self->sides);
    Py_CLEAR(self->side);
    Py_CLEAR(self->device);
    Py_CLEAR(self->named);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->device_side);
    Py_CLEAR(self->host_side);
    Py_CLEAR(self->pinned_side);
    Py_CLEAR(self->plain_types);
    Py_CLEAR(self->watchers);
    Py_CLEAR(self->copying);
    Py_CLEAR(self->dict);
    return 0;
}

static void Stay_dealloc(StayObject *self)
{
    PyObject_GC_UnTrack(self);
    Stay_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Stay_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(StayObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(StayObject, dict), READONLY},
    {NULL}
};

PyTypeObject StayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.Stay",
    .tp_basicsize = sizeof(StayObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Stay(move, fallback, moved, sides, side, device, named, tensor_type, device_side, "
              "host_side, pinned_side, plain_types, watchers, copying=None): a move that returns its tensor where a move placed it already",
    .tp_new = Stay_new,
    .tp_traverse = (traverseproc)Stay_traverse,
    .tp_clear = (inquiry)Stay_clear,
    .tp_dealloc = (destructor)Stay_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StayObject, vectorcall),
    .tp_descr_get = bind_as_method,
    .tp_dictoffset = offsetof(StayObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = Stay_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};

/* ------------------------------------------------------------------------------------ */
/* SideDevice                                                                            */
/* ------------------------------------------------------------------------------------ */

/* Tensor.device where device memory is host memory (the twin of cudashim/patches/residency.py:
 * _side_device): torch's device, as the device object of the side the tensor is known to be on.
 * Read as often as a tensor is, so the common answer (a tensor of unknown side) costs torch's
 * getter and one dict probe, and a tensor of known side the probe and torch's is_cpu (no
 * device object made to compare). */
typedef struct {
    PyObject_HEAD
    PyObject *real;           /* TensorBase.device, a getset descriptor */
    PyObject *real_is_cpu;    /* TensorBase.is_cpu, a getset descriptor */
    PyObject *sides;          /* Residency.sides: id(tensor) -> (side, weak reference) */
    PyObject *device;         /* the target's device object */
    PyObject *host;           /* the program's torch.device("cpu") */
    PyObject *device_side, *host_side, *pinned_side;
    PyObject *parameter_type; /* torch.nn.Parameter: placed where its storage is found counted */
    PyObject *memory;         /* the device memory (holds(tensor)), or None */
    PyObject *place;          /* Residency.place(tensor, side) */
    PyObject *doc;
} SideDeviceObject;

/* The side ``tensor`` is known to be on (borrowed), Py_None where not known, NULL with an error
 * set: where a move placed it, else the device where the device memory counts its storage. A
 * parameter found so is placed there, so its next read is the dict probe. */
static PyObject *known_side(SideDeviceObject *self, PyObject *tensor)
{
    PyObject *key = PyLong_FromVoidPtr(tensor), *entry, *answer;
    int yes;
    if (key == NULL)
        return NULL;
    entry = PyDict_GetItemWithError(self->sides, key);           /* borrowed */
    Py_DECREF(key);
    if (entry != NULL)
        return PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) >= 1 ? PyTuple_GET_ITEM(entry, 0) : Py_None;
    if (PyErr_Occurred())
        return NULL;
    if (self->memory == Py_None)
        return Py_None;
    yes = device_memory_holds(self->memory, tensor);
    if (yes <= 0)
        return yes < 0 ? NULL : Py_None;
    if ((PyObject *)Py_TYPE(tensor) != self->parameter_type)
        return self->device_side;
    answer = PyObject_CallFunctionObjArgs(self->place, tensor, self->device_side, NULL);
    if (answer == NULL)
        return NULL;
    Py_DECREF(answer);
    return self->device_side;
}

static PyObject *SideDevice_get(SideDeviceObject *self, PyObject *obj, PyObject *type)
{
    PyObject *side, *answer, *in_host_memory;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    side = known_side(self, obj);
    if (side == NULL)
        return NULL;
    if (side == self->device_side)
        answer = self->device;
    else if (side == self->host_side || side == self->pinned_side)
        answer = self->host;
    else
        return Py_TYPE(self->real)->tp_descr_get(self->real, obj, (PyObject *)Py_TYPE(obj));
    /* Only while the tensor is in host memory (a module moved to "meta" keeps its objects):
     * torch's own is_cpu says so without making a device object to compare. */
    in_host_memory = Py_TYPE(self->real_is_cpu)->tp_descr_get(self->real_is_cpu, obj,
                                                               (PyObject *)Py_TYPE(obj));
    if (in_host_memory == NULL)
        return NULL;
    Py_DECREF(in_host_memory);
    if (in_host_memory != Py_True)
        return Py_TYPE(self->real)->tp_descr_get(self->real, obj, (PyObject *)Py_TYPE(obj));
    Py_INCREF(answer);
    return answer;
}

static int SideDevice_set(SideDeviceObject *self, PyObject *obj, PyObject *value)
{
    /* torch's own refusal, in torch's words */
    return Py_TYPE(self->real)->tp_descr_set(self->real, obj, value);
}

static PyObject *SideDevice_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"real", "real_is_cpu", "sides", "device", "host", "device_side",
                               "host_side", "pinned_side", "parameter_type", "memory", "place",
                               "doc", NULL};
    PyObject *values[12];
    SideDeviceObject *self;
    int i;
    values[11] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOOOOO|O:SideDevice", keywords, &values[0],
                                     &values[1], &PyDict_Type, &values[2], &values[3], &values[4],
                                     &values[5], &values[6], &values[7], &values[8], &values[9],
                                     &values[10], &values[11]))
        return NULL;
    for (i = 0; i < 2; i++)
        if (Py_TYPE(values[i])->tp_descr_get == NULL || (i == 0 && Py_TYPE(values[i])->tp_descr_set == NULL)) {
            PyErr_SetString(PyExc_TypeError, "SideDevice: real and real_is_cpu must be torch's descriptors");
            return NULL;
        }
    self = (SideDeviceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    for (i = 0; i < 12; i++)
        Py_INCREF(values[i]);
    self->real = values[0];
    self->real_is_cpu = values[1];
    self->sides = values[2];
    self->device = values[3];
    self->host = values[4];
    self->device_side = values[5];
    self->host_side = values[6];
    self->pinned_side = values[7];
    self->parameter_type = values[8];
    self->memory = values[9];
    self->place = values[10];
    self->doc = values[11];
    return (PyObject *)self;
}

static int SideDevice_traverse(SideDeviceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->real);
    Py_VISIT(self->real_is_cpu);
    Py_VISIT(self->sides);
    Py_VISIT(self->device);
    Py_VISIT(self->host);
    Py_VISIT(self->device_side);
    Py_VISIT(self->host_side);
    Py_VISIT(self->pinned_side);
    Py_VISIT(self->parameter_type);
    Py_VISIT(self->memory);
    Py_VISIT(self->place);
    Py_VISIT(self->doc);
    return 0;
}

static int SideDevice_clear(SideDeviceObject *self)
{
    Py_CLEAR(self->real);
    Py_CLEAR(self->real_is_cpu);
    Py_CLEAR(self->sides);
    Py_CLEAR(self->device);
    Py_CLEAR(self->host);
    Py_CLEAR(self->device_side);
    Py_CLEAR(self->host_side);
    Py_CLEAR(self->pinned_side);
    Py_CLEAR(self->parameter_type);
    Py_CLEAR(self->memory);
    Py_CLEAR(self->place);
    Py_CLEAR(self->doc);
    return 0;
}

static void SideDevice_dealloc(SideDeviceObject *self)
{
    PyObject_GC_UnTrack(self);
    SideDevice_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef SideDevice_members[] = {
    {"__doc__", T_OBJECT, offsetof(SideDeviceObject, doc), READONLY},
    {NULL}
};

PyTypeObject SideDeviceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.SideDevice",
    .tp_basicsize = sizeof(SideDeviceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "SideDevice(real, real_is_cpu, sides, device, host, device_side, host_side, pinned_side, "
              "parameter_type, memory, place, doc=None): Tensor.device as the device of the "
              "side the tensor is known to be on",
    .tp_new = SideDevice_new,
    .tp_traverse = (traverseproc)SideDevice_traverse,
    .tp_clear = (inquiry)SideDevice_clear,
    .tp_dealloc = (destructor)SideDevice_dealloc,
    .tp_descr_get = (descrgetfunc)SideDevice_get,
    .tp_descr_set = (descrsetfunc)SideDevice_set,
    .tp_members = SideDevice_members,
};

int residency_init_names(void)
{
    device_name = PyUnicode_InternFromString("device");
    cpu_name = PyUnicode_InternFromString("cpu");
    cpu_prefix = PyUnicode_InternFromString("cpu:");
    clone_name = PyUnicode_InternFromString("clone");
    holds_name = PyUnicode_InternFromString("holds");
    add_name = PyUnicode_InternFromString("add");
    layout_name = PyUnicode_InternFromString("layout");
    moving_module_name = PyUnicode_InternFromString("moving_module");
    in_place_name = PyUnicode_InternFromString("in_place");
    is_cpu_name = PyUnicode_InternFromString("is_cpu");
    return device_name != NULL && cpu_name != NULL && cpu_prefix != NULL && clone_name != NULL &&
           holds_name != NULL && add_name != NULL && layout_name != NULL && moving_module_name != NULL &&
           in_place_name != NULL && is_cpu_name != NULL;
}
