"""A typed wrapper over the memplan.v1.Planner gRPC service (proto/memplan/v1/planner.proto).

Planner is thread-safe once constructed (a gRPC channel is). Every call raises PlannerError
when the planner answers with an error, and ValueError before sending when an argument is not
one the request can carry.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import json_format

from memplan_client._proto.memplan.v1 import planner_pb2 as pb
from memplan_client._proto.memplan.v1 import planner_pb2_grpc as pb_grpc

DTYPES = {"fp32": pb.DTYPE_FP32, "bf16": pb.DTYPE_BF16, "fp16": pb.DTYPE_FP16}
OPTIMIZERS = ("adamw", "adamw_bf16", "adamw8bit", "sgd")
METHODS = {"full": pb.TrainingMethod.FULL, "lora": pb.TrainingMethod.LORA,
           "qlora": pb.TrainingMethod.QLORA}
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HOST_MEMORY = {"pinned": pb.HOST_MEMORY_PINNED, "pageable": pb.HOST_MEMORY_PAGEABLE}
GIB = 1 << 30


class PlannerError(Exception):
    """The planner refused or failed a call: `code` is the grpc.StatusCode, `details` its text."""

    def __init__(self, rpc: str, code: grpc.StatusCode, details: str):
        super().__init__(f"{rpc} failed: {code.name}: {details}")
        self.rpc = rpc
        self.code = code
        self.details = details


def to_dict(message) -> dict:
    """A message as `memplan --json` prints it: proto field names, default values included."""
    try:  # protobuf >= 26 renamed the option that prints fields left at their default
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    except TypeError:
        return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                         including_default_value_fields=True)


def _choice(argument: str, value: str, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    if value not in allowed:
        raise ValueError(f"{argument}={value!r}: allowed: {', '.join(allowed)}")
    return value


@dataclasses.dataclass(frozen=True)
class Plan:
    """A PlanResponse: the verdict and the figures most callers read; `response` has the rest."""

    fits: bool
    reason: str
    plan_id: str
    peak_bytes: int
    capacity_bytes: int
    host_pinned_bytes: int
    host_pageable_bytes: int
    iteration_seconds: float
    tokens_per_second: float  # per GPU
    max_micro_batch: int      # 0 when limits were skipped or not even 1 fits
    max_seq_len: int
    min_gpu_memory_bytes: int
    response: pb.PlanResponse = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_response(cls, r: pb.PlanResponse) -> "Plan":
        p = r.prediction
        return cls(fits=r.fits, reason=r.reason, plan_id=r.plan_id, peak_bytes=p.peak_bytes,
                   capacity_bytes=r.capacity_bytes, host_pinned_bytes=p.host_pinned_bytes,
                   host_pageable_bytes=p.host_pageable_bytes,
                   iteration_seconds=p.iteration_seconds, tokens_per_second=p.tokens_per_second,
                   max_micro_batch=r.max_micro_batch, max_seq_len=r.max_seq_len,
                   min_gpu_memory_bytes=r.min_gpu_memory_bytes, response=r)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def residency(self) -> pb.ResidencyPlan:
        return self.response.plan

    @property
    def breakdown(self) -> pb.MemoryBreakdown:
        return self.response.prediction.breakdown

    def to_dict(self) -> dict:
        return to_dict(self.response)


@dataclasses.dataclass(frozen=True)
class Pool:
    """A pool of identical GPUs for admit(): a hardware preset or a stored profile id."""

    name: str
    gpu: Optional[str] = None          # hardware preset, e.g. "h100-80gb"
    gpus: int = 1                      # GPUs free in the pool
    hardware_id: Optional[str] = None  # a stored hardware profile instead of a preset


@dataclasses.dataclass(frozen=True)
class PoolVerdict:
    pool: str
    hardware_name: str
    gpus: int
    fits: bool
    reason: str
    plan_id: str
    peak_bytes: int
    tokens_per_second: float      # per GPU
    job_tokens_per_second: float  # per GPU x world size; 0 when it does not fit
    verdict: pb.PoolVerdict = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Admission:
    """An AdmitResponse: one verdict per pool, in request order, and the best fitting pool."""

    best_pool: str  # empty: none fits
    pools: Sequence[PoolVerdict]
    response: pb.AdmitResponse = dataclasses.field(repr=False, compare=False)

    def __getitem__(self, name: str) -> PoolVerdict:
        for verdict in self.pools:
            if verdict.pool == name:
                return verdict
        raise KeyError(name)

    def to_dict(self) -> dict:
        return to_dict(self.response)


@dataclasses.dataclass(frozen=True)
class ReportResult:
    measurement_id: str
    # (predicted - measured) / measured, reserved peak (negative: the run used more than
    # predicted); None for an out-of-memory report, whose peak is only a lower bound.
    relative_error: Optional[float]
    quarantine_reason: str  # non-empty: stored but not applied to calibration
    calibration: pb.Calibration
    response: pb.ReportMeasurementResponse = dataclasses.field(repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Presets:
    models: Sequence[str]
    hardware: Sequence[str]
    response: pb.ListPresetsResponse = dataclasses.field(repr=False, compare=False)


PoolSpec = Union[Pool, str, tuple]


class Planner:
    """A connection to memplan-planner at `address` ("host:port").

    TLS: `tls_ca` (PEM file the planner's certificate must chain to; without it the channel is
    plaintext), `tls_cert` + `tls_key` for mutual TLS, `tls_server_name` to verify another name
    than the address's host. `token` or `token_file`: the bearer token the planner's write
    authorization asks for. `timeout_seconds`: each call's deadline.
    """

    def __init__(self, address: str, *, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None, token: Optional[str] = None,
                 token_file: Optional[str] = None, timeout_seconds: float = 30.0):
        if not address:
            raise ValueError("address: expected HOST:PORT")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key: give both (mutual TLS) or neither")
        if tls_ca is None and (tls_cert or tls_server_name):
            raise ValueError("tls_cert, tls_key and tls_server_name need tls_ca")
        if token is not None and token_file is not None:
            raise ValueError("token and token_file: give one")
        if token_file is not None:
            with open(token_file, encoding="ascii") as f:
                token = f.readline().strip()
            if not token:
                raise ValueError(f"token_file={token_file!r} holds no token")
        if token is not None and not (token and all(0x21 <= ord(c) <= 0x7E for c in token)):
            raise ValueError("token: expected printable ASCII without spaces")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds={timeout_seconds}: expected > 0")
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._timeout = timeout_seconds
        if tls_ca is None:
            self._channel = grpc.insecure_channel(address)
        else:
            def read(path):
                with open(path, "rb") as f:
                    return f.read()
            credentials = grpc.ssl_channel_credentials(
                root_certificates=read(tls_ca),
                private_key=read(tls_key) if tls_key else None,
                certificate_chain=read(tls_cert) if tls_cert else None)
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name \
                else []
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._stub = pb_grpc.PlannerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Planner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, rpc: str, request):
        try:
            return getattr(self._stub, rpc)(request, timeout=self._timeout,
                                            metadata=self._metadata)
        except grpc.RpcError as error:
            raise PlannerError(rpc, error.code(), error.details()) from None

    # ------------------------------------------------------------------ requests

    @staticmethod
    def plan_request(arch: Optional[str] = None, *, gpu: Optional[str] = None,
                     hardware_id: Optional[str] = None, trace_id: Optional[str] = None,
                     batch: int = 1, seq: int = 4096, world_size: int = 1,
                     local_world_size: Optional[int] = None,
                     gpus_per_node: Optional[int] = None,
                     host_memory_gib: Optional[float] = None, grad_accum: int = 1,
                     grad_clipping: bool = False, dtype: str = "bf16",
                     optimizer: str = "adamw", method: Optional[str] = None,
                     lora_rank: Optional[int] = None,
                     lora_targets: Union[str, Sequence[str], None] = None,
                     safety_margin: Optional[float] = None, skip_limits: bool = False,
                     max_alternatives: Optional[int] = None,
                     fixed: Optional[Mapping[str, Any]] = None) -> pb.PlanRequest:
        """The PlanRequest `memplan plan` sends for the same flags (its defaults too).

        arch / trace_id: the model (a preset name, or a stored trace). gpu / hardware_id: the
        hardware (none for admit()'s job). method: "full", "lora" or "qlora" (default: "lora"
        when lora_rank is given, else "full"); LoRA needs lora_rank and lora_targets (module
        names, or "all"). fixed: knobs held fixed, by FixedKnobs field name (chunk_bytes,
        n_persist, ..., host_memory "pinned"|"pageable"). gpus_per_node (or its other name,
        local_world_size): the job's ranks on each node, sharing its RAM; host_memory_gib: the
        node's RAM in place of the hardware's, 1 to 65536 (the CLI's --gpus-per-node and
        --host-memory-gib).
        """
        request = pb.PlanRequest()
        if sum(x is not None for x in (arch, trace_id)) != 1:
            raise ValueError("arch or trace_id: give exactly one (the model)")
        if arch is not None:
            request.arch_preset = arch
        else:
            request.trace_id = trace_id
        if gpu is not None and hardware_id is not None:
            raise ValueError("gpu and hardware_id: give one")
        if gpu is not None:
            request.hardware_preset = gpu
        elif hardware_id is not None:
            request.hardware_profile_id = hardware_id
        w = request.workload
        w.micro_batch, w.seq_len, w.world_size, w.grad_accum = batch, seq, world_size, grad_accum
        w.grad_clipping = grad_clipping
        if gpus_per_node is not None and local_world_size is not None:
            raise ValueError("gpus_per_node and local_world_size: give one (the same field)")
        if gpus_per_node is not None:
            w.local_world_size = gpus_per_node
        elif local_world_size is not None:
            w.local_world_size = local_world_size
        if host_memory_gib is not None:
            request.host_memory_bytes = round(host_memory_gib * 2**30)
        request.param_dtype = DTYPES[_choice("dtype", dtype, DTYPES)]
        request.optimizer = _choice("optimizer", optimizer, OPTIMIZERS)
        if method is None:
            method = "lora" if lora_rank is not None else "full"
        _choice("method", method, METHODS)
        if method == "full":
            if lora_rank is not None or lora_targets is not None:
                raise ValueError("lora_rank and lora_targets need method='lora' or 'qlora'")
            request.training.kind = pb.TrainingMethod.FULL
        else:
            if lora_rank is None:
                raise ValueError(f"method={method!r} needs lora_rank")
            if lora_targets is None:
                raise ValueError(f"method={method!r} needs lora_targets "
                                 f"({', '.join(LORA_MODULES)}, or 'all')")
            targets = LORA_MODULES if lora_targets == "all" else (
                lora_targets.split(",") if isinstance(lora_targets, str) else list(lora_targets))
            for module in targets:
                _choice("lora_targets", module, LORA_MODULES)
            request.training.kind = METHODS[method]
            request.training.lora_rank = lora_rank
            request.training.lora_target_modules.extend(targets)
        request.fixed.SetInParent()  # present even when empty, as the CLI sends it
        for field, value in (fixed or {}).items():
            if field not in pb.FixedKnobs.DESCRIPTOR.fields_by_name:
                raise ValueError(f"fixed[{field!r}]: allowed: "
                                 + ", ".join(pb.FixedKnobs.DESCRIPTOR.fields_by_name))
            if field == "host_memory":
                value = HOST_MEMORY[_choice("fixed['host_memory']", value, HOST_MEMORY)]
            setattr(request.fixed, field, value)
        if safety_margin is not None:
            request.safety_margin = safety_margin
        if max_alternatives is not None:
            request.max_alternatives = max_alternatives
        request.skip_limits = skip_limits
        return request

    # ------------------------------------------------------------------ calls

    def plan(self, arch: Optional[str] = None, **kwargs) -> Plan:
        """Plans one job (arguments as plan_request()); gpu or hardware_id is required."""
        if kwargs.get("gpu") is None and kwargs.get("hardware_id") is None:
            raise ValueError("gpu or hardware_id: give one (the hardware)")
        return Plan.from_response(self._call("Plan", self.plan_request(arch, **kwargs)))

    def admit(self, arch: Optional[str] = None, *,
              pools: Union[Mapping[str, Union[str, tuple]], Iterable[Pool]],
              **kwargs) -> Admission:
        """Plans one job on each pool. pools: {name: "preset" | ("preset", gpus)} or Pools."""
        if "gpu" in kwargs or "hardware_id" in kwargs:
            raise ValueError("admit: the hardware comes from each pool, not gpu/hardware_id")
        request = pb.AdmitRequest(job=self.plan_request(arch, **kwargs))
        if isinstance(pools, Mapping):
            pools = [Pool(name, *((spec,) if isinstance(spec, str) else spec))
                     for name, spec in pools.items()]
        for pool in pools:
            message = request.pools.add(name=pool.name, gpus=pool.gpus)
            if (pool.gpu is None) == (pool.hardware_id is None):
                raise ValueError(f"pool {pool.name!r}: give gpu or hardware_id")
            if pool.gpu is not None:
                message.hardware_preset = pool.gpu
            else:
                message.hardware_profile_id = pool.hardware_id
        response = self._call("Admit", request)
        verdicts = [PoolVerdict(pool=v.pool, hardware_name=v.hardware_name, gpus=v.gpus,
                                fits=v.fits, reason=v.reason, plan_id=v.plan_id,
                                peak_bytes=v.prediction.peak_bytes,
                                tokens_per_second=v.prediction.tokens_per_second,
                                job_tokens_per_second=v.job_tokens_per_second, verdict=v)
                    for v in response.pools]
        return Admission(best_pool=response.best_pool, pools=verdicts, response=response)

    def report(self, plan_id: str, *, peak_reserved_bytes: int = 0,
               peak_allocated_bytes: int = 0, peak_device_bytes: int = 0,
               load_peak_bytes: int = 0, step_seconds: float = 0.0, oom: bool = False,
               note: str = "") -> ReportResult:
        """Reports what a run of plan `plan_id` measured (as `memplan measure`)."""
        if not plan_id:
            raise ValueError("plan_id is required")
        if peak_reserved_bytes <= 0 and not oom:
            raise ValueError("peak_reserved_bytes is required (the measured steady peak), "
                             "unless oom=True")
        measurement = pb.Measurement(
            plan_id=plan_id, peak_reserved_bytes=peak_reserved_bytes,
            peak_allocated_bytes=peak_allocated_bytes, peak_device_bytes=peak_device_bytes,
            load_peak_bytes=load_peak_bytes, step_seconds=step_seconds, oom=oom, note=note)
        response = self._call("ReportMeasurement",
                              pb.ReportMeasurementRequest(measurement=measurement))
        return ReportResult(measurement_id=response.measurement_id,
                            relative_error=(response.relative_error
                                            if response.HasField("relative_error") else None),
                            quarantine_reason=response.quarantine_reason,
                            calibration=response.calibration, response=response)

    def presets(self) -> Presets:
        """The model and hardware presets the planner serves."""
        response = self._call("ListPresets", pb.ListPresetsRequest())
        return Presets(models=[m.name for m in response.models],
                       hardware=[h.name for h in response.hardware], response=response)

    def get_plan(self, plan_id: str) -> pb.StoredPlan:
        """A stored plan with its request, answer and measurements."""
        return self._call("GetPlan", pb.GetPlanRequest(plan_id=plan_id)).plan
