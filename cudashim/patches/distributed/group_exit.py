"""Process groups made from an NCCL request end when NCCL's would: at ``destroy_process_group()``.

NCCL's ``destroy_process_group()`` stops the group's threads there and then. Gloo has no
shutdown: its worker and transport threads stop only when the last reference to the group
goes. And torch itself keeps one: ``torch.distributed.nn.functional`` takes ``group.WORLD`` as
the default of ten functions when it is imported, and it is imported with ``torch._dynamo``,
which DDP's constructor imports. Imported after ``init_process_group``, those defaults hold the
default group for good, so a destroyed group ends during interpreter finalisation, when
``finalize_modules`` collects torch's modules, and gloo's threads are joined there. A thread
that asks for the GIL at that point is stopped by CPython with a forced unwind that C++
destructors cannot pass, which is what ``terminate called without an active exception`` means.

So for the groups made from an NCCL request:

- after ``destroy_process_group()``, torch's own captures of the destroyed groups (function
  defaults in ``torch.distributed``) are reset to ``None``, which means the same (the default
  group) and is what they hold when imported before ``init_process_group``; objects that
  hold a destroyed group and that nothing reaches are collected. A group the program no
  longer holds then ends on the spot, as under NCCL.
- at exit, while the interpreter is still whole, groups left undestroyed are destroyed where
  every library they run is gloo (destroying gloo is local to the rank; other libraries may
  wait on their peers, so they are left to the program), and the same release follows.

A group that the program's own objects still hold at exit (a DDP model in a module global)
ends with them, as it would natively.
"""

import atexit
import gc
import logging
import sys
import types
import weakref

log = logging.getLogger(__name__)


class NcclGroupExit:
    """Remembers the groups made from an NCCL request; ends them when NCCL's would end."""

    def __init__(self, activation, dist):
        self._dist = dist
        self._registry = activation.registry
        self._groups = weakref.WeakSet()
        self._armed = False

    def remember(self, group) -> None:
        """``group`` was made for an NCCL request (ranks outside a subgroup get no group)."""
        if not isinstance(group, self._dist.ProcessGroup):
            return
        self._groups.add(group)
        if not self._armed:
            self._armed = True
            atexit.register(self.finish)
            self._registry.add_undo("atexit: end the groups made from NCCL",
                                    lambda: atexit.unregister(self.finish))

    def knows(self, group) -> bool:
        """Whether ``group`` was made for an NCCL request."""
        return group in self._groups

    def has_default(self) -> bool:
        """Whether the default group came from an NCCL request (its subgroups inherit it)."""
        return self._dist.is_initialized() and \
            self._dist.distributed_c10d._get_default_group() in self._groups

    def live(self) -> list:
        """The remembered groups torch has not destroyed."""
        pg_map = self._dist.distributed_c10d._world.pg_map
        return [group for group in list(self._groups) if group in pg_map]

    def live_ids(self) -> set:
        """Identities only: holding the groups themselves would keep them alive."""
        return {id(group) for group in self.live()}

    def released(self, live_before: set) -> None:
        """``destroy_process_group()`` returned: let go of the groups it destroyed."""
        live_now = self.live_ids()
        destroyed = [group for group in list(self._groups)
                     if id(group) in live_before and id(group) not in live_now]
        if not destroyed:
            return
        count, reset = len(destroyed), self._reset_torch_defaults(destroyed)
        del destroyed                         # the collection below may end them
        collected = gc.collect()
        log.debug("%d destroyed group(s) released: %d torch default(s) reset, %d objects collected",
                  count, reset, collected)

    def finish(self) -> None:
        """At exit, before finalisation: destroy what the program left (gloo only), then
        collect what holds groups and is no longer reachable (under ``python -m cudashim``
        the program's namespace is, once it has returned)."""
        if self._dist.is_initialized():
            c10d = self._dist.distributed_c10d
            live, default = self.live(), c10d._get_default_group()
            everything = default in live and self._only_gloo(c10d, list(c10d._world.pg_map))
            leftovers = [] if everything else [
                weakref.ref(group) for group in live
                if group is not default and self._only_gloo(c10d, [group])]
            del live, default                     # held here, they could not end below
            if everything:
                log.debug("at exit: destroying every process group (the default came from NCCL)")
                self._dist.destroy_process_group()
            for reference in leftovers:
                group = reference()
                if group is not None:             # None would mean every group to torch
                    log.debug("at exit: destroying process group %s", group.group_name)
                    self._dist.destroy_process_group(group)
                del group
        if len(self._groups):
            gc.collect()

    def _reset_torch_defaults(self, destroyed: list) -> int:
        """Function defaults in ``torch.distributed`` that hold a destroyed group become None.

        Deactivation puts back a group that still exists; the registry keeps only weak
        references, since holding the old defaults would keep the groups alive."""
        def gone(value):
            return any(value is group for group in destroyed)

        reset = 0
        for name, module in list(sys.modules.items()):
            if not (name == "torch.distributed" or name.startswith("torch.distributed.")):
                continue
            for function in list(vars(module).values()):
                if type(function) is not types.FunctionType:      # no isinstance: it reads __class__
                    continue
                for attribute in ("__defaults__", "__kwdefaults__"):
                    held = getattr(function, attribute) or ()
                    items = held.items() if isinstance(held, dict) else enumerate(held)
                    positions = {key: weakref.ref(value) for key, value in items if gone(value)}
                    if positions:
                        self._set_default_to_none(function, attribute, positions)
                        reset += 1
        return reset

    def _set_default_to_none(self, function, attribute: str, positions: dict) -> None:
        def replaced(values, by):
            if isinstance(values, dict):
                return {key: by(key, value) for key, value in values.items()}
            return tuple(by(index, value) for index, value in enumerate(values))

        setattr(function, attribute, replaced(
            getattr(function, attribute), lambda key, value: None if key in positions else value))

        def undo():
            setattr(function, attribute, replaced(getattr(function, attribute), lambda key, value: (
                positions[key]() if key in positions and value is None else value)))
        self._registry.add_undo(f"{function.__module__}.{function.__qualname__}.{attribute}", undo)

    @staticmethod
    def _only_gloo(c10d, groups) -> bool:
        for group in groups:
            library = c10d._world.pg_map.get(group, (None,))[0]
            if library is None or any(part.rpartition(":")[2] != "gloo"
                                      for part in str(library).split(",")):
                return False
        return True
