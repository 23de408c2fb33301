"""The calls of torch's device-mesh stack that depend on the mesh's device, and what each gets on
a target: the scan's table (rule CS115, ``device-mesh``). What each entry says is what the run
does (``patches/distributed``: the mesh's device type, DTensor's random state, FSDP2's streams,
the collectives, attention on DTensors), proven by the programs the device-target tests run
(``mesh_parallel.py``: FSDP2 + TP on a 2-D mesh with bfloat16, CPU offload and a distributed
checkpoint resumed by another world size, context parallelism; ``pipeline_schedules.py``;
``mesh_fsdp.py``). {device} is the target's device type, {collective} its collective library.
"""

_MESH = "a mesh of the {device} devices, its groups over '{collective}'"
_SEED = ("DTensor's random state on the {device} device's generator: replicas draw the same "
         "numbers, shards different ones, as CUDA's Philox offsets give them")
_DTENSOR = "a DTensor on the {device} mesh; its collectives run over '{collective}'"
_FSDP2 = ("FSDP2 shards over the {device} mesh, its streams the target's; MixedPrecisionPolicy "
          "and CPUOffloadPolicy as on CUDA")
_CHECKPOINT = "a sharded checkpoint of the {device} DTensors, which another world size loads"
_SCHEDULE = "a pipeline schedule: the stages' sends and receives run over '{collective}'"
# Context parallelism's ring attention runs CUDA's attention ops on each rank's blocks of the
# sequence; cudashim computes them on the target (kernels/fused_attention.py) and sends the
# sequence-sharded call there (patches/distributed/mesh_attention.py).
_CONTEXT_PARALLEL = ("context parallelism: ring attention over the {device} mesh, each block's "
                     "attention computed by cudashim's kernels for CUDA's attention ops, the blocks "
                     "passed over '{collective}'")

# qualified name -> what it gets, where it runs
CALLS = {
    "torch.distributed.device_mesh.init_device_mesh": _MESH,
    "torch.distributed.device_mesh.DeviceMesh": _MESH,
    "torch.distributed.tensor._random.manual_seed": _SEED,
    "torch.distributed._tensor.random.manual_seed": _SEED,
    "torch.distributed.tensor.distribute_tensor": _DTENSOR,
    "torch.distributed._tensor.distribute_tensor": _DTENSOR,
    "torch.distributed.tensor.DTensor.from_local": _DTENSOR,
    "torch.distributed.tensor.parallel.parallelize_module":
        "tensor- and sequence-parallel plans on the {device} mesh",
    "torch.distributed.fsdp.fully_shard": _FSDP2,
    "torch.distributed._composable.fsdp.fully_shard": _FSDP2,
    "torch.distributed.checkpoint.save": _CHECKPOINT,
    "torch.distributed.checkpoint.load": _CHECKPOINT,
    "torch.distributed.pipelining.PipelineStage":
        "a pipeline stage on the {device} device; activations move over '{collective}'",
    "torch.distributed.pipelining.ScheduleGPipe": _SCHEDULE,
    "torch.distributed.pipelining.Schedule1F1B": _SCHEDULE,
    "torch.distributed.pipelining.ScheduleInterleaved1F1B": _SCHEDULE,
    "torch.distributed.tensor.experimental.context_parallel": _CONTEXT_PARALLEL,
}
