/* What the compiled fast path's files share: the type objects the module adds, and the
 * helpers every wrapper type uses to behave as a Python function does. */

#ifndef CUDASHIM_SPEEDUPS_H
#define CUDASHIM_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>

#if PY_VERSION_HEX < 0x03090000
#error "cudashim._speedups needs Python 3.9 or later"
#endif

/* _speedups_callers.c: who asks */
extern PyTypeObject CallerCacheType, TruthSwitchType, IsCudaType;
/* _speedups_devices.c: device arguments */
extern PyTypeObject RewriterType, DefaultDeviceType, NamedDeviceType;
/* _speedups_gaps.c: filled kernel gaps */
extern PyTypeObject DtypeGateType;
/* _speedups_precision.c: the float16 policy's matmul family */
extern PyTypeObject HalfGateType;
/* _speedups_at_once.c: the float16 policy's call of inference in one frame */
extern PyTypeObject AtOnceType;
/* _speedups_reductions.c: norms and dots blocked past a length */
extern PyTypeObject LengthGateType;

/* _speedups_memory.c: storages counted on the device */
extern PyTypeObject DeviceMemoryType;
int device_memory_init_names(void);
int device_memory_holds(PyObject *memory, PyObject *tensor);
/* _speedups_residency.c: moves to where a tensor already is */
extern PyTypeObject StayType, SideDeviceType;
int residency_init_names(void);

/* _speedups.c */
PyObject *bind_as_method(PyObject *self, PyObject *obj, PyObject *type);
PyObject *wrapper_repr(PyObject *self);
extern PyGetSetDef wrapper_getset[];

#endif
