"""Each round of an elastic job's rendezvous gets a store of its own, so restarted workers meet.

torchrun's c10d rendezvous shares its agent's TCPStore with the workers (TORCHELASTIC_USE_AGENT_STORE)
and keeps that store across restarts. A restarted group's ``init_process_group`` then reads the keys
its dead predecessors wrote, the addresses gloo's ranks listened on or NCCL's unique id, and
connects to ports nobody listens on any more, until its timeout (torch 2.13, natively, on gloo as
on NCCL; pytorch/pytorch#135712). The round number is the one count every node of a restarted group
agrees on (each agent's TORCHELASTIC_RESTART_COUNT is its own). The agent, shimmed where the launch
is, hands it to the workers it starts; their store of that round is prefixed with it.
"""

import os

DYNAMIC_RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
ROUND = "CUDASHIM_RENDEZVOUS_ROUND"


def install(activation):
    activation.when_imported(DYNAMIC_RENDEZVOUS, lambda module: activation.replace(
        module.DynamicRendezvousHandler, "next_rendezvous",
        lambda original: _handing_on_the_round(original, activation.registry)))
    activation.when_imported("torch.distributed.rendezvous", lambda module: activation.replace(
        module, "_create_c10d_store", _prefixed_by_round))


def _handing_on_the_round(next_rendezvous, registry):
    def next_rendezvous_handing_on_its_round(self):
        info = next_rendezvous(self)
        if self.use_agent_store:            # the workers get this environment with their own
            registry.set_item(os.environ, ROUND, str(self._state_holder.state.round))
        return info
    return next_rendezvous_handing_on_its_round


def _prefixed_by_round(create_c10d_store):
    def create_c10d_store_of_the_round(*args, **kwargs):
        store = create_c10d_store(*args, **kwargs)
        round_number = os.environ.get(ROUND)
        if round_number is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return store
        import torch.distributed as dist
        return dist.PrefixStore(f"cudashim/rendezvous-round-{round_number}", store)
    return create_c10d_store_of_the_round
