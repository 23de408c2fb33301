"""Print how torch.compile sees a GPT program's model: graphs, graph breaks, ops, reasons.

    python tests/programs/explain_gpt.py PROGRAM DEVICE_TYPE CHECKPOINT
"""

import json
import runpy
import sys

import torch

path, device_type, checkpoint = sys.argv[1:4]
sys.argv = [path, "--steps", "1", "--checkpoint", checkpoint]
program = runpy.run_path(path, run_name="__main__")
xb, yb = program["get_batch"]()
with torch.autocast(device_type, dtype=torch.float16):
    explanation = torch._dynamo.explain(program["model"])(xb, yb)
print(json.dumps({"graphs": explanation.graph_count, "breaks": explanation.graph_break_count,
                  "ops": explanation.op_count, "reasons": [str(r.reason) for r in explanation.break_reasons]}))
