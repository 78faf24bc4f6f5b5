#!/usr/bin/env python3
"""memplan_client (python/) against the real memplan-planner on loopback with a temporary SQLite
file, and against the real memplan CLI asked the same questions.

    planner_client_test.py --planner BIN --cli BIN --python-dir DIR [unittest args...]

DIR holds memplan_client with its generated stubs (the build tree's python/, CMake target
memplan_python_client). Exits 77 (ctest: skipped) only when grpcio or protobuf is not installed
(Debian: python3-grpcio python3-protobuf, which scripts/bootstrap.sh installs).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SKIPPED = 77
ARGS = None


class Daemon:
    """memplan-planner on 127.0.0.1, port chosen by the kernel and read from its stdout."""

    def __init__(self, folder, *extra):
        self.log_path = os.path.join(folder, "planner.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [ARGS.planner, "--listen=127.0.0.1:0", "--metrics=",
                 "--db=" + os.path.join(folder, "planner.db"), "--search-threads=2", *extra],
                stdout=subprocess.PIPE, stderr=log, text=True)
        self.address = None
        for line in self.process.stdout:
            if line.startswith("listening on "):
                self.address = line[len("listening on "):].strip()
                break
        if self.address is None:
            self.process.wait()
            with open(self.log_path) as log:
                raise RuntimeError("memplan-planner exited before listening:\n" + log.read())

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


def cli_json(address, *args):
    """`memplan --planner ADDRESS --json ARGS...`'s answer, parsed."""
    result = subprocess.run([ARGS.cli, "--planner", address, "--json", *args],
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"memplan {' '.join(args)} exited {result.returncode}: "
                             f"{result.stdout}{result.stderr}")
    return json.loads(result.stdout)


def without(d, *keys):
    return {k: v for k, v in d.items() if k not in keys}


class PlannerClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="memplan-python-client-")
        cls.daemon = Daemon(cls.folder)
        cls.planner = memplan_client.Planner(cls.daemon.address, timeout_seconds=120)

    @classmethod
    def tearDownClass(cls):
        cls.planner.close()
        cls.daemon.stop()
        shutil.rmtree(cls.folder, ignore_errors=True)

    def test_plan_answers_as_the_cli_does_for_the_same_request(self):
        plan = self.planner.plan("llama-3.1-8b", gpu="h100-80gb", batch=1, seq=4096)
        self.assertTrue(plan.fits, plan.reason)
        self.assertLessEqual(plan.peak_bytes, plan.capacity_bytes)
        self.assertGreater(plan.max_micro_batch, 0)
        self.assertAlmostEqual(plan.peak_gib, plan.peak_bytes / 2**30)
        self.assertEqual(plan.residency.n_chunks, plan.response.plan.n_chunks)
        self.assertRegex(plan.plan_id, r"^plan-[0-9a-f]{16}$")
        cli = cli_json(self.daemon.address, "plan", "--arch", "llama-3.1-8b", "--gpu",
                       "h100-80gb", "--batch", "1", "--seq", "4096")
        # Everything but the answer's id and the search's wall time.
        ignored = ("plan_id", "search_seconds")
        self.assertEqual(without(plan.to_dict(), *ignored), without(cli, *ignored))
        # The planner stored the same request from both (the client's defaults are the CLI's).
        self.assertEqual(self.planner.get_plan(plan.plan_id).request,
                         self.planner.get_plan(cli["plan_id"]).request)

    def test_methods_and_optimizers_reach_the_planner(self):
        full = self.planner.plan("llama-3.1-8b", gpu="rtx-4090", skip_limits=True)
        self.assertFalse(full.fits)
        self.assertIn("does not fit", full.reason)
        lora = self.planner.plan("llama-3.1-8b", gpu="rtx-4090", method="lora", lora_rank=16,
                                 lora_targets=["q_proj", "v_proj"], skip_limits=True)
        self.assertTrue(lora.fits, lora.reason)
        qlora = self.planner.plan("llama-3.1-8b", gpu="rtx-4090", method="qlora", lora_rank=16,
                                  lora_targets="all", optimizer="adamw8bit", skip_limits=True)
        self.assertTrue(qlora.fits, qlora.reason)
        stored = self.planner.get_plan(qlora.plan_id).request
        self.assertEqual(stored.training.kind, memplan_client.pb.TrainingMethod.QLORA)
        self.assertEqual(list(stored.training.lora_target_modules),
                         list(memplan_client.LORA_MODULES))
        self.assertEqual(stored.optimizer, "adamw8bit")
        cli = cli_json(self.daemon.address, "plan", "--arch", "llama-3.1-8b", "--gpu", "rtx-4090",
                       "--lora-rank", "16", "--lora-targets", "all", "--qlora", "--optimizer",
                       "adamw8bit", "--skip-limits")
        self.assertEqual(qlora.peak_bytes, int(cli["prediction"]["peak_bytes"]))
        # An 8-bit optimizer holds less state than fp32 AdamW: the full fine-tune's peak on an
        # H100 with the search's knobs fixed the same way.
        knobs = {"chunk_bytes": 64 << 20, "host_memory": "pinned"}
        first = self.planner.plan("llama-3.2-1b", gpu="h100-80gb", fixed=knobs, skip_limits=True)
        knobs["n_persist"] = first.residency.n_chunks  # every chunk (and its state) on the GPU
        adamw = self.planner.plan("llama-3.2-1b", gpu="h100-80gb", fixed=knobs, skip_limits=True)
        adamw8 = self.planner.plan("llama-3.2-1b", gpu="h100-80gb", fixed=knobs,
                                   optimizer="adamw8bit", skip_limits=True)
        self.assertEqual(adamw.residency.n_persist, first.residency.n_chunks)
        self.assertEqual(adamw.residency.chunk_bytes, 64 << 20)
        self.assertLess(adamw8.breakdown.optimizer_state_bytes,
                        adamw.breakdown.optimizer_state_bytes / 3)
        self.assertLess(adamw8.peak_bytes, adamw.peak_bytes)

    def test_node_overrides_match_the_cli(self):
        job = dict(world_size=8, gpus_per_node=8, skip_limits=True)
        preset_node = self.planner.plan("llama-3.1-70b", gpu="h100-80gb", **job)
        self.assertFalse(preset_node.fits)
        self.assertIn("256.0 GiB shared by 8 local ranks", preset_node.reason)
        big_node = self.planner.plan("llama-3.1-70b", gpu="h100-80gb", host_memory_gib=2048,
                                     **job)
        self.assertTrue(big_node.fits, big_node.reason)
        cli = cli_json(self.daemon.address, "plan", "--arch", "llama-3.1-70b", "--gpu",
                       "h100-80gb", "--world-size", "8", "--gpus-per-node", "8",
                       "--host-memory-gib", "2048", "--skip-limits")
        ignored = ("plan_id", "search_seconds")
        self.assertEqual(without(big_node.to_dict(), *ignored), without(cli, *ignored))
        with self.assertRaisesRegex(ValueError, "gpus_per_node and local_world_size"):
            self.planner.plan_request("llama-3.1-70b", gpu="h100-80gb", world_size=8,
                                      gpus_per_node=8, local_world_size=8)

    def test_admit_matches_the_cli(self):
        admission = self.planner.admit(
            "llama-3.1-8b", batch=1, seq=4096, skip_limits=True,
            pools={"consumer": ("rtx-4090", 16), "datacenter": ("h100-80gb", 8)})
        self.assertEqual(admission.best_pool, "datacenter")
        self.assertEqual([v.pool for v in admission.pools], ["consumer", "datacenter"])
        self.assertFalse(admission["consumer"].fits)
        self.assertTrue(admission["datacenter"].fits)
        self.assertGreater(admission["datacenter"].job_tokens_per_second, 0)
        cli = cli_json(self.daemon.address, "admit", "--arch", "llama-3.1-8b", "--batch", "1",
                       "--seq", "4096", "--skip-limits", "--pool", "consumer=rtx-4090:16",
                       "--pool", "datacenter=h100-80gb:8")
        self.assertEqual(cli["best_pool"], admission.best_pool)
        for mine, theirs in zip(admission.to_dict()["pools"], cli["pools"]):
            self.assertEqual(without(mine, "plan_id"), without(theirs, "plan_id"))
        with self.assertRaisesRegex(ValueError, "hardware comes from each pool"):
            self.planner.admit("llama-3.1-8b", gpu="h100-80gb", pools={"a": "h100-80gb"})

    def test_report_a_measurement(self):
        plan = self.planner.plan("llama-3.2-1b", gpu="h100-80gb", skip_limits=True)
        # The planner compares reserved bytes: its device-level peak less the CUDA context.
        predicted = plan.peak_bytes - plan.breakdown.cuda_context_bytes
        measured = predicted + predicted // 10
        result = self.planner.report(plan.plan_id, peak_reserved_bytes=measured,
                                     peak_allocated_bytes=measured - (1 << 30),
                                     step_seconds=plan.iteration_seconds, note="python client")
        self.assertTrue(result.measurement_id)
        self.assertEqual(result.quarantine_reason, "")
        self.assertAlmostEqual(result.relative_error, (predicted - measured) / measured,
                               places=6)
        self.assertEqual((result.calibration.hardware_name, result.calibration.model_family),
                         ("h100-80gb", "llama"))
        self.assertGreaterEqual(result.calibration.samples, 1)
        stored = self.planner.get_plan(plan.plan_id)
        self.assertEqual([m.peak_reserved_bytes for m in stored.measurements], [measured])
        self.assertEqual(stored.measurements[0].note, "python client")
        oom = self.planner.report(plan.plan_id, oom=True)
        self.assertTrue(oom.measurement_id)
        self.assertIsNone(oom.relative_error)  # an OOM has no error, never 0.0 or -1
        with self.assertRaises(memplan_client.PlannerError) as raised:
            self.planner.report("plan-0000000000000000", peak_reserved_bytes=1 << 30)
        self.assertEqual(raised.exception.code.name, "NOT_FOUND")
        with self.assertRaisesRegex(ValueError, "peak_reserved_bytes is required"):
            self.planner.report(plan.plan_id)

    def test_presets(self):
        presets = self.planner.presets()
        self.assertIn("llama-3.1-8b", presets.models)
        self.assertIn("h100-80gb", presets.hardware)
        cli = cli_json(self.daemon.address, "presets")
        self.assertEqual(list(presets.models), [m["name"] for m in cli["models"]])
        self.assertEqual(list(presets.hardware), [h["name"] for h in cli["hardware"]])

    def test_errors_name_the_field(self):
        with self.assertRaises(memplan_client.PlannerError) as raised:
            self.planner.plan("gpt-17", gpu="h100-80gb")
        self.assertEqual(raised.exception.code.name, "NOT_FOUND")
        self.assertIn("arch_preset", raised.exception.details)
        with self.assertRaises(memplan_client.PlannerError) as raised:
            self.planner.plan("llama-3.1-8b", gpu="h100-80gb", batch=0)
        self.assertEqual(raised.exception.code.name, "INVALID_ARGUMENT")
        checks = [
            (dict(optimizer="adam"), "optimizer='adam': allowed: adamw, adamw_bf16, adamw8bit, sgd"),
            (dict(dtype="int8"), "dtype='int8': allowed: fp32, bf16, fp16"),
            (dict(method="ia3"), "method='ia3': allowed: full, lora, qlora"),
            (dict(method="qlora"), "method='qlora' needs lora_rank"),
            (dict(lora_rank=8), "method='lora' needs lora_targets"),
            (dict(lora_rank=8, lora_targets=["qproj"]), "lora_targets='qproj': allowed: q_proj"),
            (dict(method="full", lora_rank=8), "need method='lora' or 'qlora'"),
            (dict(fixed={"n_persists": 1}), r"fixed\['n_persists'\]: allowed: chunk_bytes"),
        ]
        for kwargs, message in checks:
            with self.subTest(kwargs=kwargs), self.assertRaisesRegex(ValueError, message):
                self.planner.plan("llama-3.1-8b", gpu="h100-80gb", **kwargs)
        with self.assertRaisesRegex(ValueError, "gpu or hardware_id"):
            self.planner.plan("llama-3.1-8b")

    def test_unreachable_planner(self):
        with memplan_client.Planner("127.0.0.1:1", timeout_seconds=5) as planner:
            with self.assertRaises(memplan_client.PlannerError) as raised:
                planner.presets()
        self.assertEqual(raised.exception.code.name, "UNAVAILABLE")


class SecuredPlannerTest(unittest.TestCase):
    """Bearer tokens and TLS, with a certificate made by openssl (Debian package openssl)."""

    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="memplan-python-client-tls-")
        if shutil.which("openssl") is None:
            raise unittest.SkipTest("openssl is missing (scripts/bootstrap.sh installs it)")
        cls.cert = os.path.join(cls.folder, "server.crt")
        key = os.path.join(cls.folder, "server.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "1", "-subj",
                        "/CN=memplan-test", "-addext",
                        "subjectAltName=DNS:planner.test,IP:127.0.0.1",
                        "-keyout", key, "-out", cls.cert],
                       check=True, capture_output=True)
        tokens = os.path.join(cls.folder, "tokens")
        with open(tokens, "w") as f:
            f.write("# name role token\nci report s3cret-token-0123456789\n")
        cls.token_file = os.path.join(cls.folder, "client-token")
        with open(cls.token_file, "w") as f:
            f.write("s3cret-token-0123456789\n")
        cls.daemon = Daemon(cls.folder, "--tls-cert=" + cls.cert, "--tls-key=" + key,
                            "--auth-token-file=" + tokens)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.folder, ignore_errors=True)

    def test_tls_and_token(self):
        with memplan_client.Planner(self.daemon.address, tls_ca=self.cert) as planner:
            plan = planner.plan("llama-3.2-1b", gpu="h100-80gb", skip_limits=True)
            self.assertTrue(plan.fits, plan.reason)
            with self.assertRaises(memplan_client.PlannerError) as raised:
                planner.report(plan.plan_id, peak_reserved_bytes=plan.peak_bytes)
            self.assertIn(raised.exception.code.name, ("UNAUTHENTICATED", "PERMISSION_DENIED"))
        with memplan_client.Planner(self.daemon.address, tls_ca=self.cert,
                                    tls_server_name="planner.test",
                                    token_file=self.token_file) as planner:
            result = planner.report(plan.plan_id, peak_reserved_bytes=plan.peak_bytes)
            self.assertTrue(result.measurement_id)
            self.assertEqual(planner.get_plan(plan.plan_id).measurements[0].reported_by, "token:ci")
        with memplan_client.Planner(self.daemon.address, timeout_seconds=5) as plaintext:
            with self.assertRaises(memplan_client.PlannerError) as raised:
                plaintext.presets()
            self.assertEqual(raised.exception.code.name, "UNAVAILABLE")
        with self.assertRaisesRegex(ValueError, "tls_cert and tls_key"):
            memplan_client.Planner(self.daemon.address, tls_ca=self.cert, tls_cert=self.cert)


class PipInstallTest(unittest.TestCase):
    """`pip install --no-build-isolation --no-index ./python` offline into a virtualenv that sees
    Debian's grpcio and protobuf, from a copy of python/ and proto/ (so the checkout stays clean):
    the build step generates the stubs, and the installed package answers the daemon."""

    def test_pip_install_from_the_checkout(self):
        source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with tempfile.TemporaryDirectory(prefix="memplan-pip-") as folder:
            tree = os.path.join(folder, "checkout")
            ignore = shutil.ignore_patterns("_proto", "build", "*.egg-info", "__pycache__")
            shutil.copytree(os.path.join(source, "python"), os.path.join(tree, "python"),
                            ignore=ignore)
            shutil.copytree(os.path.join(source, "proto"), os.path.join(tree, "proto"))
            venv = os.path.join(folder, "venv")
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           check=True, capture_output=True)
            python = os.path.join(venv, "bin", "python")
            pip = subprocess.run(
                [python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                 "--disable-pip-version-check", "./python"],
                cwd=tree, capture_output=True, text=True, timeout=300)
            self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)
            daemon = Daemon(folder)
            try:
                probe = subprocess.run(
                    [python, "-c", "import sys, memplan_client as m\n"
                     "print(m.__file__)\n"
                     "with m.Planner(sys.argv[1]) as p:\n"
                     "    print(p.plan('llama-3.2-1b', gpu='h100-80gb', skip_limits=True).fits)",
                     daemon.address],
                    cwd=folder, capture_output=True, text=True, timeout=120)
            finally:
                daemon.stop()
            self.assertEqual(probe.returncode, 0, probe.stderr)
            installed, fits = probe.stdout.split()
            self.assertTrue(installed.startswith(venv), installed)
            self.assertEqual(fits, "True")


def main():
    global ARGS, memplan_client
    parser = argparse.ArgumentParser()
    parser.add_argument("--planner", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--python-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError as error:
        print(f"SKIPPED: {error} (apt-get install python3-grpcio python3-protobuf; "
              "scripts/bootstrap.sh does)")
        return SKIPPED
    sys.path.insert(0, ARGS.python_dir)
    import memplan_client as module
    memplan_client = module
    program = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
