/* The compiled twin of patches/precision.py's _at_once.
 *
 *   AtOnce      a float16 call of inference computed in the policy's dtype: operands that
 *               are parameters with a kept copy take it, plain host tensors are converted
 *               into the thread's kept buffers, and the result is rounded to float16 where
 *               it lies
 *
 * The policy's float16 path runs on every product of a float16 model (a 4-block GPT
 * generating 24 tokens makes 504 such calls). Its Python frames cost about 6 us a call timed
 * alone, and several times that inside a model, whose products have just taken the caches:
 * more than the conversions they wrap. This twin reads the same kept copies and the same
 * buffers (the Python ConversionScratch's own dict and lists), converts through the same
 * compiled kernel, converts q, k and v split off one projection as the projection, once, and
 * calls the Python twin for every call it does not take whole: a tensor among the keywords or
 * in a list (a convolution's sizes are taken), a parameter without a valid kept copy, views of
 * one tensor that do not make it up, an operand converted alone that is not row-major, a
 * buffer that must be laid out anew, a result that is not one row-major tensor. Its answers
 * are the twin's, and so is what the buffers hold after it.
 */

#include "_speedups.h"

typedef struct {
    PyObject_HEAD
    PyObject *python;            /* the Python twin, for what this one does not take whole */
    PyObject *scratch;           /* the thread-local ConversionScratch (free, lent, held) */
    PyObject *usable;            /* kernels.native.usable: whether the compiled conversion runs */
    PyObject *convert;           /* kernels._native.convert_reduced, or None where not built */
    PyObject *threads;           /* torch.get_num_threads */
    Py_ssize_t threads_from;     /* elements from which a conversion splits over threads */
    PyObject *to_half;           /* the twin's _to_half(result, operands), for other results */
    PyObject *parameter, *tensor, *half, *bfloat16, *strided;
    PyObject *dict;
    vectorcallfunc vectorcall;
} AtOnceObject;

static PyObject *s_copies, *s_version, *s_untyped_storage, *s_data_ptr, *s_is_cpu, *s_is_nested,
    *s_layout, *s_base, *s_is_contiguous, *s_numel, *s_size, *s_stride, *s_dtype, *s_copy_,
    *s_float, *s_view, *s_nbytes, *s_free, *s_lent, *s_held, *s_budget, *s_borrowed,
    *s_given_back, *s_within_budget, *s_itemsize, *s_storage_offset, *s_as_strided, *s_is_mkldnn;

static int init_names(void)
{
    struct { PyObject **name; const char *text; } names[] = {
        {&s_copies, "copies"}, {&s_version, "_version"}, {&s_untyped_storage, "untyped_storage"},
        {&s_data_ptr, "data_ptr"}, {&s_is_cpu, "is_cpu"}, {&s_is_nested, "is_nested"},
        {&s_layout, "layout"}, {&s_base, "_base"}, {&s_is_contiguous, "is_contiguous"},
        {&s_numel, "numel"}, {&s_size, "size"}, {&s_stride, "stride"}, {&s_dtype, "dtype"},
        {&s_copy_, "copy_"}, {&s_float, "float"}, {&s_view, "view"}, {&s_nbytes, "nbytes"},
        {&s_free, "free"}, {&s_lent, "lent"}, {&s_held, "held"}, {&s_budget, "budget"},
        {&s_borrowed, "_borrowed"}, {&s_given_back, "given_back"},
        {&s_within_budget, "_within_budget"}, {&s_itemsize, "itemsize"},
        {&s_storage_offset, "storage_offset"}, {&s_as_strided, "as_strided"},
        {&s_is_mkldnn, "is_mkldnn"},
    };
    size_t i;
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (*names[i].name == NULL && (*names[i].name = PyUnicode_InternFromString(names[i].text)) == NULL)
            return 0;
    return 1;
}

/* obj.name(): a new reference, NULL on error. */
static PyObject *called(PyObject *obj, PyObject *name)
{
    return PyObject_CallMethodObjArgs(obj, name, NULL);
}

/* The truth of ``value``, a new reference it takes (NULL: an error): 1, 0, or -1 on error. */
static int truth_of(PyObject *value)
{
    int truth;
    if (value == NULL)
        return -1;
    truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* The truth of obj.name, an attribute (is_cpu), and of obj.name(), a method (is_contiguous). */
static int attribute_true(PyObject *obj, PyObject *name)
{
    return truth_of(PyObject_GetAttr(obj, name));
}

static int method_true(PyObject *obj, PyObject *name)
{
    return truth_of(called(obj, name));
}

/* obj.name() as a C integer (numel, data_ptr): -1 with an exception set on error. */
static long long integer_of(PyObject *obj, PyObject *name)
{
    PyObject *value = called(obj, name);
    long long result;
    if (value == NULL)
        return -1;
    result = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return result;
}

/* The address of a tensor's storage, as ``t.untyped_storage().data_ptr()``: 0 with the error
 * cleared where it has none to tell (the twin's _operand_storages then gives up: -1 here), -2
 * on another error. */
static long long storage_address(PyObject *tensor)
{
    PyObject *storage = called(tensor, s_untyped_storage);
    long long address;
    if (storage != NULL) {
        address = integer_of(storage, s_data_ptr);
        Py_DECREF(storage);
        if (address != -1 || !PyErr_Occurred())
            return address;
    }
    if (PyErr_ExceptionMatches(PyExc_RuntimeError) || PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
        PyErr_Clear();
        return -1;
    }
    return -2;
}

/* Whether the weak reference ``ref`` refers to ``obj``: 1, 0, or -1 on error. */
static int refers_to(PyObject *ref, PyObject *obj)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *referent;
    int found = PyWeakref_GetRef(ref, &referent);
    if (found <= 0)
        return found;
    found = referent == obj;
    Py_DECREF(referent);
    return found;
#else
    PyObject *referent = PyWeakref_GetObject(ref);
    return referent == NULL ? -1 : referent == obj;
#endif
}

/* The kept copy of a parameter in ``dtype`` (a borrowed reference) where it is still valid,
 * as the twin checks it: the same parameter, version and storage. NULL with no error where
 * there is none; NULL with an error set on error. */
static PyObject *kept_copy(PyObject *copies, PyObject *parameter, PyObject *dtype)
{
    PyObject *key, *kept, *version, *storage;
    int same;
    key = Py_BuildValue("(NO)", PyLong_FromVoidPtr(parameter), dtype);
    if (key == NULL)
        return NULL;
    kept = PyDict_GetItemWithError(copies, key);
    Py_DECREF(key);
    if (kept == NULL || !PyTuple_Check(kept) || PyTuple_GET_SIZE(kept) != 4)
        return NULL;
    if (refers_to(PyTuple_GET_ITEM(kept, 0), parameter) <= 0)
        return NULL;
    version = PyObject_GetAttr(parameter, s_version);
    if (version == NULL)
        return NULL;
    same = PyObject_RichCompareBool(PyTuple_GET_ITEM(kept, 1), version, Py_EQ);
    Py_DECREF(version);
    if (same <= 0)
        return NULL;
    storage = called(parameter, s_untyped_storage);
    if (storage == NULL)
        return NULL;
    same = refers_to(PyTuple_GET_ITEM(kept, 2), storage);   /* one Python object while it lives */
    Py_DECREF(storage);
    if (same <= 0)
        return NULL;
    return PyTuple_GET_ITEM(kept, 3);
}

/* Whether a plain operand can be taken here: a strided host tensor, row-major (1) or not (2);
 * or not taken (0), -1 on error. ``*base``: a new reference to the tensor it is a view of, or
 * NULL where it is none. */
static int takes_operand(AtOnceObject *self, PyObject *value, PyObject **base)
{
    PyObject *layout;
    int truth;
    if ((truth = attribute_true(value, s_is_cpu)) <= 0)
        return truth;
    if ((truth = attribute_true(value, s_is_nested)) != 0)
        return truth < 0 ? -1 : 0;
    if ((layout = PyObject_GetAttr(value, s_layout)) == NULL)
        return -1;
    Py_DECREF(layout);
    if (layout != self->strided)
        return 0;
    if ((*base = PyObject_GetAttr(value, s_base)) == NULL)
        return -1;
    if (*base == Py_None)
        Py_CLEAR(*base);
    if ((truth = method_true(value, s_is_contiguous)) < 0)
        return -1;
    return truth ? 1 : 2;
}

/* A tensor method's answer as a C integer (numel, storage_offset); -1 with an error set on
 * error. */
static Py_ssize_t size_of(PyObject *tensor, PyObject *name)
{
    return (Py_ssize_t)integer_of(tensor, name);
}

/* Whether the views ``wide[i]`` (where ``bases[i]`` is ``base``) are, together, the whole of
 * ``base``, as the twin's _converted_together asks: ``base`` a row-major float16 tensor, every
 * view float16, its elements within ``base``'s, and as many elements in all as it has. 1, 0, or
 * -1 on error. */
static int views_make_up(AtOnceObject *self, PyObject *base, PyObject *const *wide,
                         PyObject *const *bases, Py_ssize_t n, Py_ssize_t *start)
{
    PyObject *dtype, *sizes = NULL, *strides = NULL;
    Py_ssize_t numel, total = 0, i, d, offset, last;
    int truth;
    if ((dtype = PyObject_GetAttr(base, s_dtype)) == NULL)
        return -1;
    Py_DECREF(dtype);
    if (dtype != self->half)
        return 0;
    if ((truth = method_true(base, s_is_contiguous)) <= 0)
        return truth;
    if ((numel = size_of(base, s_numel)) < 0 || (*start = size_of(base, s_storage_offset)) < 0)
        return -1;
    for (i = 0; i < n; i++) {
        if (bases[i] == NULL)
            continue;
        if (bases[i] != base)
            return 0;
        if ((dtype = PyObject_GetAttr(wide[i], s_dtype)) == NULL)
            return -1;
        Py_DECREF(dtype);
        if (dtype != self->half)
            return 0;
        if ((offset = size_of(wide[i], s_storage_offset)) < 0)
            return -1;
        if ((sizes = called(wide[i], s_size)) == NULL || (strides = called(wide[i], s_stride)) == NULL
                || !PyTuple_Check(sizes) || !PyTuple_Check(strides)
                || PyTuple_GET_SIZE(sizes) != PyTuple_GET_SIZE(strides))
            goto failed;
        last = offset;
        for (d = 0; d < PyTuple_GET_SIZE(sizes); d++) {
            Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(sizes, d));
            Py_ssize_t stride = PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, d));
            if (PyErr_Occurred())
                goto failed;
            if (size)
                last += (size - 1) * stride;
        }
        Py_CLEAR(sizes);
        Py_CLEAR(strides);
        if (!(*start <= offset && offset <= last && last < *start + numel))
            return 0;
        if ((offset = size_of(wide[i], s_numel)) < 0)
            return -1;
        total += offset;
    }
    return total == numel;
failed:
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    return PyErr_Occurred() ? -1 : 0;
}

/* A kept buffer for ``value`` in ``dtype``, lent to the call (appended to ``lent``): the one
 * last given back of its size where it is laid out as asked, else the twin's _borrowed. */
static PyObject *borrowed(AtOnceObject *self, PyObject *free, PyObject *lent, PyObject *value,
                          PyObject *dtype, Py_ssize_t itemsize, Py_ssize_t numel)
{
    PyObject *nbytes = NULL, *sizes = NULL, *strides = NULL, *kept, *buffer = NULL, *other;
    int same = 0;
    if ((nbytes = PyLong_FromSsize_t(numel * itemsize)) == NULL
            || (sizes = called(value, s_size)) == NULL || (strides = called(value, s_stride)) == NULL)
        goto done;
    kept = PyDict_GetItemWithError(free, nbytes);
    if (kept != NULL && PyList_CheckExact(kept) && PyList_GET_SIZE(kept) > 0) {
        PyObject *last = PyList_GET_ITEM(kept, PyList_GET_SIZE(kept) - 1);
        PyObject *held, *less;
        if ((other = PyObject_GetAttr(last, s_dtype)) == NULL)
            goto done;
        same = other == dtype;
        Py_DECREF(other);
        if (same) {
            if ((other = called(last, s_size)) == NULL)
                goto done;
            same = PyObject_RichCompareBool(other, sizes, Py_EQ);
            Py_DECREF(other);
        }
        if (same > 0) {
            if ((other = called(last, s_stride)) == NULL)
                goto done;
            same = PyObject_RichCompareBool(other, strides, Py_EQ);
            Py_DECREF(other);
        }
        if (same < 0)
            goto done;
        if (same) {
            Py_INCREF(last);
            buffer = last;
            if (PyList_SetSlice(kept, PyList_GET_SIZE(kept) - 1, PyList_GET_SIZE(kept), NULL) < 0
                    || (PyList_GET_SIZE(kept) == 0 && PyDict_DelItem(free, nbytes) < 0)
                    || (held = PyObject_GetAttr(self->scratch, s_held)) == NULL)
                goto failed;
            less = PyNumber_Subtract(held, nbytes);
            Py_DECREF(held);
            if (less == NULL || PyObject_SetAttr(self->scratch, s_held, less) < 0) {
                Py_XDECREF(less);
                goto failed;
            }
            Py_DECREF(less);
            if (PyList_Append(lent, buffer) < 0)
                goto failed;
            goto done;
        }
    } else if (PyErr_Occurred()) {
        goto done;
    }
    buffer = PyObject_CallMethodObjArgs(self->scratch, s_borrowed, nbytes, dtype, sizes, strides, NULL);
    goto done;
failed:
    Py_CLEAR(buffer);
done:
    Py_XDECREF(nbytes);
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    return buffer;
}

/* convert_reduced(source, destination, numel, to_bfloat16, threads), as native._convert calls
 * it: 1 where it converted, 0 where the CPU cannot, -1 on error. */
static int converted(AtOnceObject *self, long long source, long long destination, Py_ssize_t numel,
                     int to_bfloat16)
{
    PyObject *threads, *done;
    if (numel >= self->threads_from)
        threads = PyObject_CallNoArgs(self->threads);
    else
        threads = PyLong_FromLong(1);
    if (threads == NULL)
        return -1;
    done = PyObject_CallFunction(self->convert, "LLnOO", source, destination, numel,
                                 to_bfloat16 ? Py_True : Py_False, threads);
    Py_DECREF(threads);
    return truth_of(done);
}

/* Into a borrowed buffer: the compiled conversion where it runs, else as the twin converts
 * (float16 to bfloat16 by way of float32). 0, or -1 on error. */
static int converted_into_buffer(AtOnceObject *self, PyObject *value, PyObject *buffer,
                                 PyObject *dtype, int reduced, Py_ssize_t numel)
{
    PyObject *source, *done;
    if (reduced) {
        long long from = integer_of(value, s_data_ptr), to;
        int fast;
        if (from == -1 && PyErr_Occurred())
            return -1;
        to = integer_of(buffer, s_data_ptr);
        if (to == -1 && PyErr_Occurred())
            return -1;
        if ((fast = converted(self, from, to, numel, 1)) != 0)
            return fast < 0 ? -1 : 0;
    }
    if (dtype == self->bfloat16) {
        if ((source = called(value, s_float)) == NULL)
            return -1;
    } else {
        Py_INCREF(value);
        source = value;
    }
    done = PyObject_CallMethodObjArgs(buffer, s_copy_, source, NULL);
    Py_DECREF(source);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* The twin's ConversionScratch.given_back(start, result): the buffers lent from ``start`` on
 * are kept for the next call, but for one ``result`` holds. Taken here for a result that is one
 * tensor, or none (an error): kept at the end of the list of their size, which moves to the
 * end of the dict (the most recent size last). 0, or -1 on error. */
static int given_back(AtOnceObject *self, PyObject *lent, Py_ssize_t start, PyObject *result)
{
    PyObject *borrowed_now, *free = NULL, *held = NULL, *budget = NULL;
    long long holds = 0;
    Py_ssize_t i;
    int status = -1, over;
    if (PyList_GET_SIZE(lent) == start)
        return 0;
    if (result != NULL && Py_TYPE(result) != (PyTypeObject *)self->tensor) {
        PyObject *index = PyLong_FromSsize_t(start), *done;
        if (index == NULL)
            return -1;
        done = PyObject_CallMethodObjArgs(self->scratch, s_given_back, index, result, NULL);
        Py_DECREF(index);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    if (result != NULL && (holds = storage_address(result)) < -1)
        return -1;
    borrowed_now = PyList_GetSlice(lent, start, PyList_GET_SIZE(lent));
    if (borrowed_now == NULL || PyList_SetSlice(lent, start, PyList_GET_SIZE(lent), NULL) < 0)
        goto done;
    if (holds == -1) {                     /* a result with no storage to tell: none is kept */
        status = 0;
        goto done;
    }
    if ((free = PyObject_GetAttr(self->scratch, s_free)) == NULL
            || (held = PyObject_GetAttr(self->scratch, s_held)) == NULL)
        goto done;
    for (i = 0; i < PyList_GET_SIZE(borrowed_now); i++) {
        PyObject *buffer = PyList_GET_ITEM(borrowed_now, i), *storage, *nbytes, *sized, *more;
        long long address = storage_address(buffer);
        if (address < -1)
            goto done;
        if (result != NULL && address == holds)
            continue;                      /* the result is laid over it: the result's now */
        if ((storage = called(buffer, s_untyped_storage)) == NULL)
            goto done;
        nbytes = called(storage, s_nbytes);
        Py_DECREF(storage);
        if (nbytes == NULL)
            goto done;
        sized = PyDict_GetItemWithError(free, nbytes);
        if (sized != NULL) {
            Py_INCREF(sized);
            if (PyDict_DelItem(free, nbytes) < 0 || PyList_Append(sized, buffer) < 0) {
                Py_DECREF(sized);
                Py_DECREF(nbytes);
                goto done;
            }
        } else if (PyErr_Occurred() || (sized = PyList_New(1)) == NULL) {
            Py_DECREF(nbytes);
            goto done;
        } else {
            Py_INCREF(buffer);
            PyList_SET_ITEM(sized, 0, buffer);
        }
        over = PyDict_SetItem(free, nbytes, sized);
        Py_DECREF(sized);
        more = over < 0 ? NULL : PyNumber_Add(held, nbytes);
        Py_DECREF(nbytes);
        if (more == NULL)
            goto done;
        Py_SETREF(held, more);
    }
    if (PyObject_SetAttr(self->scratch, s_held, held) < 0
            || (budget = PyObject_GetAttr(self->scratch, s_budget)) == NULL
            || (over = PyObject_RichCompareBool(held, budget, Py_GT)) < 0)
        goto done;
    if (over) {
        PyObject *done = called(self->scratch, s_within_budget);
        if (done == NULL)
            goto done;
        Py_DECREF(done);
    }
    status = 0;
done:
    Py_XDECREF(borrowed_now);
    Py_XDECREF(free);
    Py_XDECREF(held);
    Py_XDECREF(budget);
    return status;
}

/* The result in float16: a row-major bfloat16 tensor in memory of its own (no operand's
 * storage) rounded where it lies, else the twin's _to_half with the operands' storages. */
static PyObject *to_half(AtOnceObject *self, PyObject *result, PyObject *const *wide, Py_ssize_t n,
                         int reduced)
{
    PyObject *operands = NULL, *rounded, *dtype, *address;
    long long holds, where;
    Py_ssize_t i, numel;
    int own = 1, fast = 0;
    if (!reduced)
        return PyObject_CallFunctionObjArgs(self->to_half, result, Py_None, NULL);
    if ((operands = PySet_New(NULL)) == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        int packed;
        if (!PyObject_TypeCheck(wide[i], (PyTypeObject *)self->tensor))
            continue;
        /* a weight packed for oneDNN holds no memory a result could share, and asking for its
           storage raises, at the cost of a C++ exception's stack trace */
        if ((packed = attribute_true(wide[i], s_is_mkldnn)) < 0)
            goto failed;
        if (packed)
            continue;
        if ((where = storage_address(wide[i])) < -1)
            goto failed;
        if (where == -1) {                 /* one tells none: the twin converts a copy */
            Py_CLEAR(operands);
            Py_INCREF(Py_None);
            operands = Py_None;
            break;
        }
        if ((address = PyLong_FromLongLong(where)) == NULL || PySet_Add(operands, address) < 0) {
            Py_XDECREF(address);
            goto failed;
        }
        Py_DECREF(address);
    }
    if (operands != Py_None && Py_TYPE(result) == (PyTypeObject *)self->tensor) {
        if ((dtype = PyObject_GetAttr(result, s_dtype)) == NULL)
            goto failed;
        Py_DECREF(dtype);
        if (dtype == self->bfloat16) {
            int nested = 0;
            if ((fast = method_true(result, s_is_contiguous)) < 0
                    || (fast && (nested = attribute_true(result, s_is_nested)) < 0))
                goto failed;
            fast = fast && !nested;
        }
    }
    if (fast) {
        if ((holds = storage_address(result)) < -1)
            goto failed;
        if (holds != -1) {
            if ((address = PyLong_FromLongLong(holds)) == NULL
                    || (own = PySet_Contains(operands, address)) < 0) {
                Py_XDECREF(address);
                goto failed;
            }
            Py_DECREF(address);
            own = !own;
        }
        if (holds != -1 && own) {
            long long start = integer_of(result, s_data_ptr);
            int done;
            if (start == -1 && PyErr_Occurred())
                goto failed;
            if ((numel = (Py_ssize_t)integer_of(result, s_numel)) == -1 && PyErr_Occurred())
                goto failed;
            if ((done = converted(self, start, start, numel, 0)) < 0)
                goto failed;
            if (done) {
                Py_DECREF(operands);
                return PyObject_CallMethodObjArgs(result, s_view, self->half, NULL);
            }
        }
    }
    rounded = PyObject_CallFunctionObjArgs(self->to_half, result, operands, NULL);
    Py_DECREF(operands);
    return rounded;
failed:
    Py_XDECREF(operands);
    return NULL;
}

/* Every reference ``wide`` and ``bases`` hold dropped, and the arrays freed. */
static void released(PyObject **wide, PyObject **bases, char *plain, Py_ssize_t n)
{
    Py_ssize_t i;
    for (i = 0; i < n; i++) {
        if (wide != NULL)
            Py_XDECREF(wide[i]);
        if (bases != NULL)
            Py_XDECREF(bases[i]);
    }
    PyMem_Free(wide);
    PyMem_Free(bases);
    PyMem_Free(plain);
}

/* The view ``view`` of a tensor starting at ``start`` in its storage, laid the same way over
 * ``whole`` (that tensor converted): a new reference. */
static PyObject *same_view_of(PyObject *whole, PyObject *view, Py_ssize_t start)
{
    PyObject *sizes = NULL, *strides = NULL, *offset = NULL, *laid = NULL;
    Py_ssize_t at;
    if ((at = size_of(view, s_storage_offset)) < 0 && PyErr_Occurred())
        return NULL;
    if ((sizes = called(view, s_size)) != NULL && (strides = called(view, s_stride)) != NULL
            && (offset = PyLong_FromSsize_t(at - start)) != NULL)
        laid = PyObject_CallMethodObjArgs(whole, s_as_strided, sizes, strides, offset, NULL);
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    Py_XDECREF(offset);
    return laid;
}

/* The twin's _holds_a_tensor: whether ``value`` is a list or tuple with a tensor among its
 * items, at any depth (einsum's operands, not a convolution's sizes): 1 or 0, -1 on error. */
static int holds_a_tensor(AtOnceObject *self, PyObject *value)
{
    PyObject *items;
    Py_ssize_t i, n;
    int found = 0;
    if (!PyList_Check(value) && !PyTuple_Check(value))
        return 0;
    if ((items = PySequence_Fast(value, "")) == NULL)
        return -1;
    if (Py_EnterRecursiveCall(" in AtOnce's walk of a call's lists")) {
        Py_DECREF(items);
        return -1;
    }
    n = PySequence_Fast_GET_SIZE(items);
    for (i = 0; i < n && !found; i++) {
        PyObject *item = PySequence_Fast_ITEMS(items)[i];
        found = PyObject_TypeCheck(item, (PyTypeObject *)self->tensor) ? 1 : holds_a_tensor(self, item);
    }
    Py_LeaveRecursiveCall();
    Py_DECREF(items);
    return found;
}

/* at_once(original, dtype, cache, args, kwargs), as the twin. */
static PyObject *AtOnce_vectorcall(AtOnceObject *self, PyObject *const *call, size_t nargsf,
                                   PyObject *kwnames)
{
    PyObject *original, *dtype, *cache, *args, *kwargs, *copies = NULL, *free = NULL, *lent = NULL;
    PyObject **wide = NULL, **bases = NULL, *wide_args = NULL, *result = NULL, *value, *itemsize_object;
    PyObject *base = NULL;
    PyObject *type, *error, *traceback;
    Py_ssize_t n = 0, i, pos = 0, start = 0, itemsize, base_start = 0;
    int views = 0, together = 0, reduced = 0, takes, lending = 0;
    char *plain = NULL;

    if (PyVectorcall_NARGS(nargsf) != 5 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "AtOnce takes original, dtype, cache, args, kwargs");
        return NULL;
    }
    original = call[0], dtype = call[1], cache = call[2], args = call[3], kwargs = call[4];
    if (!PyTuple_Check(args) || !PyDict_Check(kwargs))
        goto twin;
    while (PyDict_Next(kwargs, &pos, NULL, &value)) {
        if (PyObject_TypeCheck(value, (PyTypeObject *)self->tensor))
            goto twin;
        if ((takes = holds_a_tensor(self, value)) != 0) {
            if (takes < 0)
                return NULL;
            goto twin;
        }
    }
    n = PyTuple_GET_SIZE(args);
    if ((copies = PyObject_GetAttr(cache, s_copies)) == NULL)
        goto finished;
    if (!PyDict_Check(copies))
        goto twin;
    /* wide[i]: a new reference to what the call is given in place of args[i] */
    if ((wide = PyMem_Calloc(n ? n : 1, sizeof(PyObject *))) == NULL
            || (bases = PyMem_Calloc(n ? n : 1, sizeof(PyObject *))) == NULL
            || (plain = PyMem_Calloc(n ? n : 1, 1)) == NULL) {
        PyErr_NoMemory();
        goto finished;
    }
    for (i = 0; i < n; i++) {
        value = PyTuple_GET_ITEM(args, i);
        if (Py_TYPE(value) == (PyTypeObject *)self->parameter) {
            PyObject *kept = kept_copy(copies, value, dtype);
            if (kept == NULL)
                goto error_or_twin;          /* widened and kept by the general path */
            value = kept;
        } else if (Py_TYPE(value) == (PyTypeObject *)self->tensor) {
            if ((takes = takes_operand(self, value, &bases[i])) <= 0)
                goto error_or_twin;
            plain[i] = (char)takes;
            if (bases[i] != NULL && views++ == 0)
                base = bases[i];             /* borrowed: bases[i] holds it */
        } else if (PyObject_TypeCheck(value, (PyTypeObject *)self->tensor)) {
            goto twin;
        } else if ((takes = holds_a_tensor(self, value)) != 0) {
            if (takes < 0)
                goto finished;
            goto twin;
        }
        Py_INCREF(value);
        wide[i] = value;
    }
    if (views > 1) {
        /* q, k and v split off one projection: converted as it, once, where they make it up */
        if ((together = views_make_up(self, base, wide, bases, n, &base_start)) < 0)
            goto finished;
        if (!together)
            goto twin;
    }
    for (i = 0; i < n; i++)                  /* what is converted alone is converted whole */
        if (plain[i] == 2 && !(together && bases[i] != NULL))
            goto twin;
    if (dtype == self->bfloat16 && self->convert != Py_None) {
        if ((reduced = truth_of(PyObject_CallNoArgs(self->usable))) < 0)
            goto finished;
    }
    if ((itemsize_object = PyObject_GetAttr(dtype, s_itemsize)) == NULL)
        goto finished;
    itemsize = PyLong_AsSsize_t(itemsize_object);
    Py_DECREF(itemsize_object);
    if (itemsize == -1 && PyErr_Occurred())
        goto finished;
    if ((free = PyObject_GetAttr(self->scratch, s_free)) == NULL
            || (lent = PyObject_GetAttr(self->scratch, s_lent)) == NULL)
        goto finished;
    if (!PyDict_CheckExact(free) || !PyList_CheckExact(lent)) {
        PyErr_SetString(PyExc_TypeError, "AtOnce: the scratch's free and lent are a dict and a list");
        goto finished;
    }
    start = PyList_GET_SIZE(lent);
    lending = 1;
    /* From here every buffer borrowed is given back, whatever happens. */
    if (together) {                          /* first, as the twin borrows */
        PyObject *whole;
        Py_ssize_t numel;
        if ((numel = size_of(base, s_numel)) < 0 && PyErr_Occurred())
            goto finished;
        if ((whole = borrowed(self, free, lent, base, dtype, itemsize, numel)) == NULL)
            goto finished;
        if (converted_into_buffer(self, base, whole, dtype, reduced, numel) < 0) {
            Py_DECREF(whole);
            goto finished;
        }
        for (i = 0; i < n; i++) {
            PyObject *laid;
            if (bases[i] == NULL)
                continue;
            if ((laid = same_view_of(whole, wide[i], base_start)) == NULL) {
                Py_DECREF(whole);
                goto finished;
            }
            Py_SETREF(wide[i], laid);
            plain[i] = 0;                    /* converted */
        }
        Py_DECREF(whole);
    }
    for (i = 0; i < n; i++) {
        PyObject *buffer;
        Py_ssize_t numel;
        if (!plain[i])
            continue;
        if ((numel = (Py_ssize_t)integer_of(wide[i], s_numel)) == -1 && PyErr_Occurred())
            goto finished;
        if ((buffer = borrowed(self, free, lent, wide[i], dtype, itemsize, numel)) == NULL)
            goto finished;
        if (converted_into_buffer(self, wide[i], buffer, dtype, reduced, numel) < 0) {
            Py_DECREF(buffer);
            goto finished;
        }
        Py_SETREF(wide[i], buffer);
    }
    if ((wide_args = PyTuple_New(n)) == NULL)
        goto finished;
    for (i = 0; i < n; i++) {
        Py_INCREF(wide[i]);
        PyTuple_SET_ITEM(wide_args, i, wide[i]);
    }
    result = PyObject_Call(original, wide_args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
    goto finished;

error_or_twin:
    if (PyErr_Occurred())
        goto finished;
twin:
    released(wide, bases, plain, n);
    Py_XDECREF(copies);
    return PyObject_Vectorcall(self->python, call, nargsf, kwnames);

finished:
    if (lending) {
        PyErr_Fetch(&type, &error, &traceback);
        if (given_back(self, lent, start, result) < 0) {
            Py_CLEAR(result);
            Py_XDECREF(type);
            Py_XDECREF(error);
            Py_XDECREF(traceback);
        } else {
            PyErr_Restore(type, error, traceback);
        }
    }
    if (result != NULL)
        Py_SETREF(result, to_half(self, result, wide, n, reduced));
    Py_XDECREF(wide_args);
    released(wide, bases, plain, n);
    Py_XDECREF(copies);
    Py_XDECREF(free);
    Py_XDECREF(lent);
    return result;
}

static PyObject *AtOnce_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"python", "scratch", "usable", "convert", "threads", "threads_from",
                               "to_half", "parameter", "tensor", "half", "bfloat16", "strided", NULL};
    PyObject *python, *scratch, *usable, *convert, *threads, *to_half, *parameter, *tensor, *half,
        *bfloat16, *strided;
    Py_ssize_t threads_from;
    AtOnceObject *self;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOnOOOOOO:AtOnce", keywords, &python, &scratch,
                                     &usable, &convert, &threads, &threads_from, &to_half, &parameter,
                                     &tensor, &half, &bfloat16, &strided))
        return NULL;
    if (!PyType_Check(parameter) || !PyType_Check(tensor)) {
        PyErr_SetString(PyExc_TypeError, "AtOnce: parameter and tensor are types");
        return NULL;
    }
    if (!init_names())
        return NULL;
    self = (AtOnceObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(python);
    self->python = python;
    Py_INCREF(scratch);
    self->scratch = scratch;
    Py_INCREF(usable);
    self->usable = usable;
    Py_INCREF(convert);
    self->convert = convert;
    Py_INCREF(threads);
    self->threads = threads;
    self->threads_from = threads_from;
    Py_INCREF(to_half);
    self->to_half = to_half;
    Py_INCREF(parameter);
    self->parameter = parameter;
    Py_INCREF(tensor);
    self->tensor = tensor;
    Py_INCREF(half);
    self->half = half;
    Py_INCREF(bfloat16);
    self->bfloat16 = bfloat16;
    Py_INCREF(strided);
    self->strided = strided;
    self->vectorcall = (vectorcallfunc)AtOnce_vectorcall;
    return (PyObject *)self;
}

static int AtOnce_traverse(AtOnceObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->python);
    Py_VISIT(self->scratch);
    Py_VISIT(self->usable);
    Py_VISIT(self->convert);
    Py_VISIT(self->threads);
    Py_VISIT(self->to_half);
    Py_VISIT(self->parameter);
    Py_VISIT(self->tensor);
    Py_VISIT(self->half);
    Py_VISIT(self->bfloat16);
    Py_VISIT(self->strided);
    Py_VISIT(self->dict);
    return 0;
}

static int AtOnce_clear(AtOnceObject *self)
{
    Py_CLEAR(self->python);
    Py_CLEAR(self->scratch);
    Py_CLEAR(self->usable);
    Py_CLEAR(self->convert);
    Py_CLEAR(self->threads);
    Py_CLEAR(self->to_half);
    Py_CLEAR(self->parameter);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->half);
    Py_CLEAR(self->bfloat16);
    Py_CLEAR(self->strided);
    Py_CLEAR(self->dict);
    return 0;
}

static void AtOnce_dealloc(AtOnceObject *self)
{
    PyObject_GC_UnTrack(self);
    AtOnce_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef AtOnce_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(AtOnceObject, vectorcall), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(AtOnceObject, dict), READONLY},
    {"python", T_OBJECT, offsetof(AtOnceObject, python), READONLY},
    {NULL}
};

PyTypeObject AtOnceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cudashim._speedups.AtOnce",
    .tp_basicsize = sizeof(AtOnceObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "AtOnce(python, scratch, usable, convert, threads, threads_from, to_half, parameter,\n"
              "tensor, half, bfloat16, strided): at_once(original, dtype, cache, args, kwargs),\n"
              "a float16 call of inference computed in dtype in one frame; python, its twin, takes\n"
              "every call this one does not take whole (see cudashim/patches/precision.py)",
    .tp_new = AtOnce_new,
    .tp_traverse = (traverseproc)AtOnce_traverse,
    .tp_clear = (inquiry)AtOnce_clear,
    .tp_dealloc = (destructor)AtOnce_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AtOnceObject, vectorcall),
    .tp_dictoffset = offsetof(AtOnceObject, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = AtOnce_members,
    .tp_getset = wrapper_getset,
    .tp_repr = wrapper_repr,
};
