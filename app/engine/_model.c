/* The engine model's per-request hot path in C: plan_calls, a virtual clock's lanes and an
 * engine's counters.
 *
 * app/engine/planner.py, clock.py (LaneHeap) and simulated.py (EngineCounters) are the
 * reference; this file reproduces them decision for decision (same calls, same floats in the
 * same order, same error messages) and tests/unit/engine compares the two on the same inputs.
 * It builds the
 * reference's own frozen dataclasses (EngineCall, CallPlan, Reservation) without running
 * their Python __init__: each field stored in its slot, as object.__setattr__ in that
 * __init__ stores it through the slot's member descriptor.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <structmember.h>

#define SECTOR_SIZE 512
#define SECTOR_SHIFT 9

static PyObject *EngineCall_type, *CallPlan_type, *InvalidInput_type, *builtin_sum;

static PyObject *s_bulk, *s_offset, *s_nbytes, *s_sector, *s_nr_units, *s_first_segment,
    *s_nr_segments, *s_op, *s_dispatch_mode, *s_data_unit_size, *s_calls, *s_fallback_reason,
    *s_ready_ns, *s_start_ns, *s_end_ns, *s_busy_ns, *s_unsupported_reason,
    *s_max_bytes_per_call, *s_max_segments_per_call, *s_bios;

#define CALL_FIELDS 7
#define PLAN_FIELDS 6
#define RESERVATION_FIELDS 4
static Py_ssize_t call_offsets[CALL_FIELDS], plan_offsets[PLAN_FIELDS];

/* Where a slotted class keeps each of ``names`` in its instances: the offsets of the
 * fields' member descriptors (object slots of the class itself, as __slots__ makes them). */
static int
slot_offsets(PyObject *type, PyObject *const *names, Py_ssize_t *offsets, int n)
{
    for (int i = 0; i < n; i++) {
        PyObject *descr = PyDict_GetItemWithError(((PyTypeObject *)type)->tp_dict, names[i]);
        if (descr == NULL && PyErr_Occurred())
            return -1;
        PyMemberDef *member = NULL;
        if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type))
            member = ((PyMemberDescrObject *)descr)->d_member;
        if (member == NULL || member->type != T_OBJECT_EX || (member->flags & READONLY) ||
            PyDescr_TYPE(descr) != (PyTypeObject *)type) {
            PyErr_Format(PyExc_TypeError, "%R has no writable slot %R of its own", type, names[i]);
            return -1;
        }
        offsets[i] = member->offset;
    }
    return 0;
}

/* A frozen slotted dataclass from its field values, each stored in its slot (``offsets``,
 * from slot_offsets); steals every value reference. */
static PyObject *
make_frozen(PyObject *type, const Py_ssize_t *offsets, PyObject **values, int n)
{
    for (int i = 0; i < n; i++) {
        if (values[i] == NULL) goto fail;
    }
    PyObject *obj = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (obj == NULL) goto fail;
    for (int i = 0; i < n; i++) *(PyObject **)((char *)obj + offsets[i]) = values[i];
    return obj;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(values[i]);
    return NULL;
}

static PyObject *
engine_call(int bulk, long long offset, long long nbytes, long long sector, long long nr_units,
            long long first_segment, long long nr_segments)
{
    PyObject *v[CALL_FIELDS];
    v[0] = Py_NewRef(bulk ? Py_True : Py_False);
    v[1] = PyLong_FromLongLong(offset);
    v[2] = PyLong_FromLongLong(nbytes);
    v[3] = PyLong_FromLongLong(sector);
    v[4] = PyLong_FromLongLong(nr_units);
    v[5] = PyLong_FromLongLong(first_segment);
    v[6] = PyLong_FromLongLong(nr_segments);
    return make_frozen(EngineCall_type, call_offsets, v, CALL_FIELDS);
}

/* What a (capabilities, spec, unit) decides, kept while both objects live: they are frozen.
 * Filled only once every Python call has returned, so another thread never sees half an entry. */
typedef struct {
    PyObject *caps, *spec;
    long long unit;
    PyObject *reason; /* fallback_reason: str or None */
    long long max_bytes, max_segments;
} Decision;

#define DECISIONS 8
static Decision decisions[DECISIONS];
static int next_decision;

/* The decision, copied into *out with a new reference to its reason; -1 with an exception set
 * (InvalidInput if the engine cannot run the spec at all). */
static int
decide(PyObject *caps, PyObject *spec, PyObject *unit_obj, long long unit, Decision *out)
{
    for (int i = 0; i < DECISIONS; i++) {
        Decision *d = &decisions[i];
        if (d->caps == caps && d->spec == spec && d->unit == unit) {
            *out = *d;
            Py_INCREF(out->reason);
            return 0;
        }
    }
    PyObject *unsupported = PyObject_CallMethodObjArgs(caps, s_unsupported_reason, spec, unit_obj, NULL);
    if (unsupported == NULL) return -1;
    if (unsupported != Py_None) {
        PyErr_Format(InvalidInput_type, "engine cannot process this volume: %S", unsupported);
        Py_DECREF(unsupported);
        return -1;
    }
    Py_DECREF(unsupported);
    PyObject *reason = PyObject_CallMethodObjArgs(caps, s_fallback_reason, spec, NULL);
    if (reason == NULL) return -1;
    PyObject *mb = PyObject_GetAttr(caps, s_max_bytes_per_call);
    PyObject *ms = mb ? PyObject_GetAttr(caps, s_max_segments_per_call) : NULL;
    long long max_bytes = mb ? PyLong_AsLongLong(mb) : -1;
    long long max_segments = ms ? PyLong_AsLongLong(ms) : -1;
    Py_XDECREF(mb);
    Py_XDECREF(ms);
    if (PyErr_Occurred()) {
        Py_DECREF(reason);
        return -1;
    }
    Decision fresh = {Py_NewRef(caps), Py_NewRef(spec), unit, Py_NewRef(reason), max_bytes, max_segments};
    Decision old = decisions[next_decision];
    decisions[next_decision] = fresh;
    next_decision = (next_decision + 1) % DECISIONS;
    Py_XDECREF(old.caps);
    Py_XDECREF(old.spec);
    Py_XDECREF(old.reason);
    *out = fresh;
    out->reason = reason;
    return 0;
}

static int
is_str(PyObject *obj, const char *text)
{
    return PyUnicode_Check(obj) && PyUnicode_CompareWithASCIIString(obj, text) == 0;
}

/* First index whose end is > x (bisect_right) or >= x (bisect_left). */
static Py_ssize_t
bisect_right(const long long *ends, Py_ssize_t n, long long x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < ends[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

static Py_ssize_t
bisect_left(const long long *ends, Py_ssize_t n, long long x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (ends[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The bios as byte regions of the request, checked (planner._bio_regions); -1 on error. */
static Py_ssize_t
bio_regions(PyObject *bios, long long sector, long long nbytes, long long unit, long long **out)
{
    PyObject *seq = PySequence_Fast(bios, "bios must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long long *regions = PyMem_Malloc(sizeof(long long) * 2 * (n ? n : 1));
    if (regions == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    long long offset = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i), "a bio is (sector, nr_sectors)");
        if (item == NULL) goto fail;
        if (PySequence_Fast_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_ValueError, "a bio is (sector, nr_sectors), got %zd items",
                         PySequence_Fast_GET_SIZE(item));
            Py_DECREF(item);
            goto fail;
        }
        long long bio_sector = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(item, 0));
        long long nr_sectors = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(item, 1));
        Py_DECREF(item);
        if (PyErr_Occurred()) goto fail;
        long long length = nr_sectors * SECTOR_SIZE;
        if (bio_sector != sector + offset / SECTOR_SIZE || nr_sectors <= 0) {
            PyErr_SetString(InvalidInput_type,
                            "bios must be contiguous, non-empty and start at the request sector");
            goto fail;
        }
        if (length % unit) {
            PyErr_Format(InvalidInput_type, "bio at sector %lld is not whole %lld-byte units",
                         bio_sector, unit);
            goto fail;
        }
        regions[2 * i] = offset;
        regions[2 * i + 1] = offset + length;
        offset += length;
    }
    Py_DECREF(seq);
    if (offset != nbytes) {
        PyErr_Format(InvalidInput_type, "bios cover %lld bytes, the segments %lld", offset, nbytes);
        PyMem_Free(regions);
        return -1;
    }
    *out = regions;
    return n;
fail:
    Py_DECREF(seq);
    PyMem_Free(regions);
    return -1;
}

static int
unit_calls(PyObject *calls, const long long *ends, Py_ssize_t n, long long nbytes, long long sector,
           long long unit)
{
    long long step = unit / SECTOR_SIZE;
    long long index = 0;
    for (long long offset = 0; offset < nbytes; offset += unit, index++) {
        Py_ssize_t first = bisect_right(ends, n, offset);
        Py_ssize_t last = bisect_left(ends, n, offset + unit);
        PyObject *call = engine_call(0, offset, unit, sector + index * step, 1, first, last - first + 1);
        if (call == NULL) return -1;
        int rc = PyList_Append(calls, call);
        Py_DECREF(call);
        if (rc < 0) return -1;
    }
    return 0;
}

static int
bulk_calls(PyObject *calls, const Decision *d, const long long *ends, Py_ssize_t n, long long start,
           long long end, long long sector, long long unit)
{
    long long max_bytes = d->max_bytes / unit * unit;
    long long max_segments = d->max_segments;
    long long offset = start;
    while (offset < end) {
        Py_ssize_t first = bisect_right(ends, n, offset);
        long long stop = offset + max_bytes < end ? offset + max_bytes : end;
        long long last_allowed = first + max_segments - 1;
        if (last_allowed < n - 1) {
            long long by_segments = offset + (ends[last_allowed] - offset) / unit * unit;
            /* A unit over more segments than allowed still goes alone: there is no smaller call. */
            long long floor = by_segments > offset + unit ? by_segments : offset + unit;
            stop = stop < floor ? stop : floor;
        }
        Py_ssize_t last = bisect_left(ends, n, stop);
        long long length = stop - offset;
        PyObject *call = engine_call(1, offset, length, sector + offset / SECTOR_SIZE, length / unit,
                                     first, last - first + 1);
        if (call == NULL) return -1;
        int rc = PyList_Append(calls, call);
        Py_DECREF(call);
        if (rc < 0) return -1;
        offset = stop;
    }
    return 0;
}

static PyObject *
call_plan(PyObject *op, PyObject *mode, long long unit, long long nbytes, PyObject *calls,
          PyObject *reason)
{
    PyObject *v[PLAN_FIELDS] = {Py_NewRef(op), Py_NewRef(mode), PyLong_FromLongLong(unit),
                      PyLong_FromLongLong(nbytes), calls, Py_NewRef(reason)};
    return make_frozen(CallPlan_type, plan_offsets, v, PLAN_FIELDS);
}

#define LOCAL_ENDS 32

/* plan_calls' usual call, three positional arguments and keywords it knows by their interned
 * names (the names in a caller's code are interned), read off the vector call as it comes: no
 * dict, no PyArg_ParseTupleAndKeywords (which builds a str per keyword it looks up). 0: not
 * that shape, nothing set; PyArg_ParseTupleAndKeywords decides (and names any fault).
 * Borrowed references, as PyArg_ParseTupleAndKeywords gives. */
static int
plan_arguments_fast(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **caps,
                    PyObject **spec, PyObject **segments, PyObject **op, PyObject **unit,
                    PyObject **mode, PyObject **sector, PyObject **bios)
{
    if (nargs != 3 || kwnames == NULL) return 0;
    PyObject *keys[5] = {s_op, s_data_unit_size, s_dispatch_mode, s_sector, s_bios};
    PyObject *found[5] = {NULL, NULL, NULL, NULL, NULL};
    Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int k = 0;
        while (k < 5 && keys[k] != name) k++;
        if (k == 5) return 0; /* an unknown keyword, or a known one not interned */
        found[k] = args[nargs + i];
    }
    *caps = args[0];
    *spec = args[1];
    *segments = args[2];
    if (found[0] != NULL) *op = found[0];
    if (found[1] != NULL) *unit = found[1];
    if (found[2] != NULL) *mode = found[2];
    if (found[3] != NULL) *sector = found[3];
    if (found[4] != NULL) *bios = found[4];
    return 1;
}

/* Any other call shape, through the generic parser: the reference's errors for faulty ones. */
static int
plan_arguments_parsed(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **caps,
                      PyObject **spec, PyObject **segments, PyObject **op, PyObject **unit,
                      PyObject **mode, PyObject **sector, PyObject **bios)
{
    static char *keywords[] = {"capabilities", "spec", "segments", "op", "data_unit_size",
                               "dispatch_mode", "sector", "bios", NULL};
    PyObject *tuple = PyTuple_New(nargs), *dict = NULL;
    if (tuple == NULL) return -1;
    for (Py_ssize_t i = 0; i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    if (kwnames != NULL) {
        if ((dict = PyDict_New()) == NULL) goto fail;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) goto fail;
        }
    }
    int parsed = PyArg_ParseTupleAndKeywords(tuple, dict, "OOO|$OOOOO", keywords, caps, spec,
                                             segments, op, unit, mode, sector, bios);
    /* Borrowed from the caller's vector, not from the tuple and dict dropped here. */
    Py_DECREF(tuple);
    Py_XDECREF(dict);
    return parsed ? 0 : -1;
fail:
    Py_DECREF(tuple);
    Py_XDECREF(dict);
    return -1;
}

static PyObject *
plan_calls(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *caps, *spec, *segments, *op = NULL, *unit_obj = NULL, *mode = NULL, *sector_obj = NULL,
                                      *bios = Py_None;
    if (!plan_arguments_fast(args, nargs, kwnames, &caps, &spec, &segments, &op, &unit_obj, &mode,
                             &sector_obj, &bios) &&
        plan_arguments_parsed(args, nargs, kwnames, &caps, &spec, &segments, &op, &unit_obj, &mode,
                              &sector_obj, &bios) < 0)
        return NULL;
    if (op == NULL || unit_obj == NULL || mode == NULL) {
        PyErr_SetString(PyExc_TypeError, "plan_calls needs op, data_unit_size and dispatch_mode");
        return NULL;
    }
    if (EngineCall_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "app.engine._model is not bound to the planner");
        return NULL;
    }
    long long unit = PyLong_AsLongLong(unit_obj);
    long long sector = sector_obj == NULL ? 0 : PyLong_AsLongLong(sector_obj);
    if (PyErr_Occurred()) return NULL;
    /* The reference asks fallback_reason only past the geometry checks; a SpecLike answers
     * it without raising, so asking first decides the same. */
    Decision decision, *d = &decision;
    if (decide(caps, spec, unit_obj, unit, d) < 0) return NULL;
    if (unit <= 0) {
        Py_DECREF(d->reason);
        PyErr_SetString(PyExc_ValueError, "data_unit_size must be positive");
        return NULL;
    }

    PyObject *seq = PySequence_Fast(segments, "segments must be a sequence");
    if (seq == NULL) {
        Py_DECREF(d->reason);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long long local[LOCAL_ENDS], *ends = local, *regions = NULL;
    PyObject *result = NULL, *calls = NULL;
    if (n > LOCAL_ENDS && (ends = PyMem_Malloc(sizeof(long long) * n)) == NULL) {
        Py_DECREF(seq);
        Py_DECREF(d->reason);
        return PyErr_NoMemory();
    }
    long long nbytes = 0, smallest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long size = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (size == -1 && PyErr_Occurred()) goto done;
        smallest = i == 0 || size < smallest ? size : smallest;
        nbytes += size;
        ends[i] = nbytes;
    }
    /* planner._check_geometry, in its order */
    if (n == 0) {
        PyErr_SetString(InvalidInput_type, "a request needs at least one segment");
        goto done;
    }
    if (smallest <= 0) {
        PyErr_SetString(InvalidInput_type, "segment sizes must be positive");
        goto done;
    }
    if (nbytes % unit) {
        PyErr_Format(InvalidInput_type, "request of %lld bytes is not a whole number of %lld-byte units",
                     nbytes, unit);
        goto done;
    }
    if (sector > LLONG_MAX / SECTOR_SIZE) {
        PyErr_SetString(PyExc_OverflowError, "sector out of the 64-bit range");
        goto done;
    }
    if (sector < 0 || (sector * SECTOR_SIZE) % unit) {
        PyErr_Format(InvalidInput_type, "sector %lld is not aligned to the %lld-byte data unit", sector,
                     unit);
        goto done;
    }
    int bio_mode = is_str(mode, "bio");
    if (d->reason == Py_None && n == 1 &&
        (is_str(mode, "request") || bios == Py_None || PyObject_Length(bios) == 1) &&
        nbytes <= d->max_bytes) {
        if (PyErr_Occurred()) goto done;
        /* One segment that fits one call (a lone small bio): what bulk_calls would plan. */
        if (bio_mode && bios != Py_None && bio_regions(bios, sector, nbytes, unit, &regions) < 0)
            goto done;
        PyObject *call = engine_call(1, 0, nbytes, sector, nbytes / unit, 0, 1);
        if (call == NULL) goto done;
        calls = PyTuple_New(1);
        if (calls == NULL) {
            Py_DECREF(call);
            goto done;
        }
        PyTuple_SET_ITEM(calls, 0, call);
        result = call_plan(op, mode, unit, nbytes, calls, Py_None);
        calls = NULL;
        goto done;
    }
    if (PyErr_Occurred()) goto done;
    calls = PyList_New(0);
    if (calls == NULL) goto done;
    if (d->reason != Py_None) {
        if (unit_calls(calls, ends, n, nbytes, sector, unit) < 0) goto done;
    } else if (bio_mode && bios != Py_None) {
        Py_ssize_t count = bio_regions(bios, sector, nbytes, unit, &regions);
        if (count < 0) goto done;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (bulk_calls(calls, d, ends, n, regions[2 * i], regions[2 * i + 1], sector, unit) < 0)
                goto done;
        }
    } else if (bulk_calls(calls, d, ends, n, 0, nbytes, sector, unit) < 0) {
        goto done;
    }
    PyObject *tuple = PyList_AsTuple(calls);
    if (tuple == NULL) goto done;
    result = call_plan(op, mode, unit, nbytes, tuple, d->reason);
done:
    Py_XDECREF(calls);
    PyMem_Free(regions);
    if (ends != local) PyMem_Free(ends);
    Py_DECREF(seq);
    Py_DECREF(d->reason);
    return result;
}

static PyObject *
bind_plan(PyObject *self, PyObject *args)
{
    PyObject *call, *plan, *invalid;
    if (!PyArg_ParseTuple(args, "O!O!O!:bind_plan", &PyType_Type, &call, &PyType_Type, &plan,
                          &PyType_Type, &invalid))
        return NULL;
    PyObject *call_names[CALL_FIELDS] = {s_bulk,     s_offset,        s_nbytes,     s_sector,
                                         s_nr_units, s_first_segment, s_nr_segments};
    PyObject *plan_names[PLAN_FIELDS] = {s_op,    s_dispatch_mode, s_data_unit_size,
                                         s_nbytes, s_calls,        s_fallback_reason};
    Py_ssize_t calls[CALL_FIELDS], plans[PLAN_FIELDS];
    if (slot_offsets(call, call_names, calls, CALL_FIELDS) < 0 ||
        slot_offsets(plan, plan_names, plans, PLAN_FIELDS) < 0)
        return NULL;
    memcpy(call_offsets, calls, sizeof(calls));
    memcpy(plan_offsets, plans, sizeof(plans));
    Py_XSETREF(EngineCall_type, Py_NewRef(call));
    Py_XSETREF(CallPlan_type, Py_NewRef(plan));
    Py_XSETREF(InvalidInput_type, Py_NewRef(invalid));
    Py_RETURN_NONE;
}

/* ---- Lanes: a VirtualClock's lanes and totals (clock.LaneHeap) ---- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t lanes;
    double *free; /* a heap of lane free times, as heapq keeps it */
    PyObject *reservation_type;
    Py_ssize_t reservation_offsets[RESERVATION_FIELDS];
    long long reservations;
    double busy;
    long long wait, max_wait;
    PyObject *first_start; /* None until the first reservation */
    long long last_end;
} Lanes;

static int
Lanes_init(Lanes *self, PyObject *args, PyObject *kwargs)
{
    Py_ssize_t lanes;
    PyObject *reservation;
    if (!PyArg_ParseTuple(args, "nO!:Lanes", &lanes, &PyType_Type, &reservation)) return -1;
    if (lanes < 1) {
        PyErr_SetString(PyExc_ValueError, "a clock needs at least one lane");
        return -1;
    }
    PyObject *names[RESERVATION_FIELDS] = {s_ready_ns, s_start_ns, s_end_ns, s_busy_ns};
    if (slot_offsets(reservation, names, self->reservation_offsets, RESERVATION_FIELDS) < 0)
        return -1;
    double *free_times = PyMem_Calloc(lanes, sizeof(double));
    if (free_times == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->free);
    self->free = free_times;
    self->lanes = lanes;
    Py_XSETREF(self->reservation_type, Py_NewRef(reservation));
    Py_XSETREF(self->first_start, Py_NewRef(Py_None));
    self->reservations = 0;
    self->busy = 0.0;
    self->wait = self->max_wait = self->last_end = 0;
    return 0;
}

static void
Lanes_dealloc(Lanes *self)
{
    PyMem_Free(self->free);
    Py_XDECREF(self->reservation_type);
    Py_XDECREF(self->first_start);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* heapq.heapreplace on floats: the same sift steps, so the same heap. */
static void
heapreplace(double *heap, Py_ssize_t size, double item)
{
    Py_ssize_t pos = 0, child = 1;
    while (child < size) {
        Py_ssize_t right = child + 1;
        if (right < size && !(heap[child] < heap[right])) child = right;
        heap[pos] = heap[child];
        pos = child;
        child = 2 * pos + 1;
    }
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (item < heap[parent]) {
            heap[pos] = heap[parent];
            pos = parent;
            continue;
        }
        break;
    }
    heap[pos] = item;
}

/* round(x) of a float, as float.__round__ without ndigits computes it. */
static int
round_half_even(double x, long long *out)
{
    double rounded = round(x);
    if (fabs(x - rounded) == 0.5) rounded = 2.0 * round(x / 2.0);
    if (isnan(rounded)) {
        PyErr_SetString(PyExc_ValueError, "cannot convert float NaN to integer");
        return -1;
    }
    if (!(rounded >= -9223372036854775808.0 && rounded < 9223372036854775808.0)) {
        PyErr_SetString(PyExc_OverflowError, "virtual time out of the 64-bit range");
        return -1;
    }
    *out = (long long)rounded;
    return 0;
}

#define LOCAL_DURATIONS 16

static PyObject *
Lanes_reserve(Lanes *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "reserve(durations, ready_ns)");
        return NULL;
    }
    PyObject *ready_obj = args[1];
    long long ready = PyLong_AsLongLong(ready_obj);
    if (ready == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "durations must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double busy, local[LOCAL_DURATIONS], *durations = local;
    PyObject *result = NULL;
    if (n == 1 && PyFloat_CheckExact(PySequence_Fast_GET_ITEM(seq, 0))) {
        busy = 0.0 + PyFloat_AS_DOUBLE(PySequence_Fast_GET_ITEM(seq, 0)); /* sum() starts at 0 */
    } else {
        PyObject *total = PyObject_CallOneArg(builtin_sum, seq);
        busy = total ? PyFloat_AsDouble(total) : -1.0;
        Py_XDECREF(total);
        if (busy == -1.0 && PyErr_Occurred()) goto done;
    }
    double readyf = (double)ready, start, end;
    double *free_times = self->free;
    if (self->lanes == 1 || n == 0) {
        start = free_times[0] > readyf ? free_times[0] : readyf;
        end = start + busy;
        if (self->lanes == 1) free_times[0] = end;
    } else {
        if (n > LOCAL_DURATIONS && (durations = PyMem_Malloc(sizeof(double) * n)) == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            durations[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
            if (durations[i] == -1.0 && PyErr_Occurred()) goto done;
        }
        start = INFINITY;
        end = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) {
            double begin = free_times[0] > readyf ? free_times[0] : readyf;
            double finish = begin + durations[i];
            heapreplace(free_times, self->lanes, finish);
            start = begin < start ? begin : start;
            end = finish > end ? finish : end;
        }
    }
    long long start_ns, end_ns, busy_ns;
    if (round_half_even(start, &start_ns) < 0 || round_half_even(end, &end_ns) < 0 ||
        round_half_even(busy, &busy_ns) < 0)
        goto done;
    /* The totals move before anything that could run Python code (the allocation may collect). */
    long long wait = start_ns - ready;
    self->reservations += 1;
    self->busy += busy;
    self->wait += wait;
    self->max_wait = wait > self->max_wait ? wait : self->max_wait;
    self->last_end = end_ns > self->last_end ? end_ns : self->last_end;
    if (self->first_start == Py_None) {
        PyObject *first = PyLong_FromLongLong(start_ns);
        if (first == NULL) goto done;
        Py_SETREF(self->first_start, first);
    }
    PyObject *values[RESERVATION_FIELDS] = {Py_NewRef(ready_obj), PyLong_FromLongLong(start_ns),
                           PyLong_FromLongLong(end_ns), PyLong_FromLongLong(busy_ns)};
    result = make_frozen(self->reservation_type, self->reservation_offsets, values,
                         RESERVATION_FIELDS);
done:
    if (durations != local) PyMem_Free(durations);
    Py_DECREF(seq);
    return result;
}

static PyObject *
Lanes_totals(Lanes *self, PyObject *unused)
{
    return Py_BuildValue("(LdLLOL)", self->reservations, self->busy, self->wait, self->max_wait,
                         self->first_start, self->last_end);
}

static PyMethodDef Lanes_methods[] = {
    {"reserve", (PyCFunction)(void (*)(void))Lanes_reserve, METH_FASTCALL,
     "Place durations (ns, in order) on the earliest-free lanes from ready_ns."},
    {"totals", (PyCFunction)Lanes_totals, METH_NOARGS,
     "(reservations, busy, wait, max_wait, first_start, last_end) so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Lanes_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app.engine._model.Lanes",
    .tp_basicsize = sizeof(Lanes),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A virtual clock's lanes and totals; clock.LaneHeap is the reference.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lanes_init,
    .tp_dealloc = (destructor)Lanes_dealloc,
    .tp_methods = Lanes_methods,
};

/* ---- Counters: an engine's per-request statistics (simulated.EngineCounters) ---- */

typedef struct {
    PyObject_HEAD
    long long requests, bulk_calls, unit_calls, encrypted, decrypted, cpu_ns;
} Counters;

static PyObject *s_encrypt, *s_decrypt;

/* Field ``index`` of a plan (plan_names' order in bind_plan): read from its slot when the
 * plan is of the bound CallPlan class itself, else by name, with the same errors. */
static PyObject *
plan_field(PyObject *plan, int index, PyObject *name)
{
    if (CallPlan_type != NULL && Py_IS_TYPE(plan, (PyTypeObject *)CallPlan_type)) {
        PyObject *value = *(PyObject **)((char *)plan + plan_offsets[index]);
        if (value != NULL)
            return Py_NewRef(value);
    }
    return PyObject_GetAttr(plan, name);
}

static PyObject *
Counters_count(Counters *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "count(plan, cpu_ns)");
        return NULL;
    }
    PyObject *plan = args[0];
    PyObject *calls = plan_field(plan, 4, s_calls);
    if (calls == NULL) return NULL;
    Py_ssize_t nr_calls = PyObject_Length(calls);
    Py_DECREF(calls);
    if (nr_calls < 0) return NULL;
    PyObject *reason = plan_field(plan, 5, s_fallback_reason);
    if (reason == NULL) return NULL;
    int bulk = reason == Py_None;
    Py_DECREF(reason);
    /* The reference's order, so an odd plan leaves the same partial count behind. */
    self->requests += 1;
    if (bulk) self->bulk_calls += nr_calls;
    else self->unit_calls += nr_calls;
    PyObject *op = plan_field(plan, 0, s_op);
    if (op == NULL) return NULL;
    long long *bytes = NULL;
    if (PyUnicode_Check(op) && PyUnicode_Compare(op, s_encrypt) == 0) bytes = &self->encrypted;
    else if (PyUnicode_Check(op) && PyUnicode_Compare(op, s_decrypt) == 0) bytes = &self->decrypted;
    else PyErr_SetObject(PyExc_KeyError, op);
    Py_DECREF(op);
    if (bytes == NULL) return NULL;
    PyObject *nbytes_obj = plan_field(plan, 3, s_nbytes);
    if (nbytes_obj == NULL) return NULL;
    long long nbytes = PyLong_AsLongLong(nbytes_obj);
    Py_DECREF(nbytes_obj);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    *bytes += nbytes;
    long long cpu_ns;
    if (PyFloat_Check(args[1])) {
        if (round_half_even(PyFloat_AS_DOUBLE(args[1]), &cpu_ns) < 0) return NULL;
    } else if ((cpu_ns = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred()) {
        return NULL;
    }
    self->cpu_ns += cpu_ns;
    Py_RETURN_NONE;
}

static PyObject *
Counters_totals(Counters *self, PyObject *unused)
{
    return Py_BuildValue("(LLLLLL)", self->requests, self->bulk_calls, self->unit_calls,
                         self->encrypted, self->decrypted, self->cpu_ns);
}

static PyMethodDef Counters_methods[] = {
    {"count", (PyCFunction)(void (*)(void))Counters_count, METH_FASTCALL,
     "Count one request's plan and its CPU IV time (ns)."},
    {"totals", (PyCFunction)Counters_totals, METH_NOARGS,
     "(requests, bulk_calls, unit_calls, bytes encrypted, bytes decrypted, cpu_ns) so far."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Counters_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app.engine._model.Counters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An engine's per-request statistics; simulated.EngineCounters is the reference.",
    .tp_new = PyType_GenericNew,
    .tp_methods = Counters_methods,
};

static PyMethodDef module_methods[] = {
    {"plan_calls", (PyCFunction)(void (*)(void))plan_calls, METH_FASTCALL | METH_KEYWORDS,
     "planner.plan_calls, decision for decision."},
    {"bind_plan", bind_plan, METH_VARARGS,
     "bind_plan(EngineCall, CallPlan, InvalidInput): the classes plan_calls builds and raises."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "app.engine._model",
    "The engine model's per-request hot path in C; the Python modules are the reference.", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__model(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_bulk, "bulk"},
        {&s_offset, "offset"},
        {&s_nbytes, "nbytes"},
        {&s_sector, "sector"},
        {&s_nr_units, "nr_units"},
        {&s_first_segment, "first_segment"},
        {&s_nr_segments, "nr_segments"},
        {&s_op, "op"},
        {&s_dispatch_mode, "dispatch_mode"},
        {&s_data_unit_size, "data_unit_size"},
        {&s_calls, "calls"},
        {&s_fallback_reason, "fallback_reason"},
        {&s_ready_ns, "ready_ns"},
        {&s_start_ns, "start_ns"},
        {&s_end_ns, "end_ns"},
        {&s_busy_ns, "busy_ns"},
        {&s_unsupported_reason, "unsupported_reason"},
        {&s_max_bytes_per_call, "max_bytes_per_call"},
        {&s_max_segments_per_call, "max_segments_per_call"},
        {&s_bios, "bios"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return NULL;
    }
    PyObject *builtins = PyImport_ImportModule("builtins");
    if (builtins == NULL) return NULL;
    builtin_sum = PyObject_GetAttrString(builtins, "sum");
    Py_DECREF(builtins);
    if (builtin_sum == NULL) return NULL;
    if ((s_encrypt = PyUnicode_InternFromString("encrypt")) == NULL) return NULL;
    if ((s_decrypt = PyUnicode_InternFromString("decrypt")) == NULL) return NULL;
    if (PyType_Ready(&Lanes_type) < 0 || PyType_Ready(&Counters_type) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Lanes", (PyObject *)&Lanes_type) < 0 ||
        PyModule_AddObjectRef(m, "Counters", (PyObject *)&Counters_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
