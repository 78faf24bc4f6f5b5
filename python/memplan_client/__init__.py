"""memplan_client: a Python client of memplan-planner (gRPC, proto/memplan/v1/planner.proto).

    from memplan_client import Planner
    with Planner("127.0.0.1:50051") as planner:
        plan = planner.plan("llama-3.1-8b", gpu="h100-80gb", batch=1, seq=4096)
        print(plan.fits, plan.peak_gib, plan.plan_id)

The generated stubs are memplan_client.pb (messages) and memplan_client.pb_grpc (PlannerStub).
"""
from memplan_client._proto.memplan.v1 import planner_pb2 as pb
from memplan_client._proto.memplan.v1 import planner_pb2_grpc as pb_grpc
from memplan_client.client import (
    DTYPES, LORA_MODULES, METHODS, OPTIMIZERS, Admission, Plan, Planner, PlannerError, Pool,
    PoolVerdict, Presets, ReportResult, to_dict)

__all__ = ["Admission", "DTYPES", "LORA_MODULES", "METHODS", "OPTIMIZERS", "Plan", "Planner",
           "PlannerError", "Pool", "PoolVerdict", "Presets", "ReportResult", "pb", "pb_grpc",
           "to_dict"]
__version__ = "0.1.0"
