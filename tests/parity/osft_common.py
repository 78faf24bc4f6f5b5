"""What osft_parity_test.py and osft_export_test.py share: the command line and scratch directory,
hf_parity_test's checkpoints written by name, and the tally's report.

Imported from the test scripts' own directory (a script's directory is first on sys.path).
"""

import argparse
import os
import shutil
import tempfile

import torch
import transformers

import hf_parity_test as hf


def setup(doc, binary_flag, binary_help, work_prefix, only=False):
    """Parses `binary_flag` (required), --work and, where `only`, --only; uses two torch threads;
    empties the work directory (a fresh temporary one without --work). Returns (args, work, tally).
    """
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument(binary_flag, required=True, help=binary_help)
    parser.add_argument("--work", help="scratch directory (default: a temporary one)")
    if only:
        parser.add_argument("--only", help="run only cases whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = args.work or tempfile.mkdtemp(prefix=work_prefix)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, work dir {work}")
    return args, work, hf.Tally()


def write_checkpoint(directory, ckpt_name, seed):
    """Writes hf_parity_test.CHECKPOINTS[ckpt_name] with random weights drawn from `seed`."""
    family, overrides, edit = hf.CHECKPOINTS[ckpt_name]
    hf.write_checkpoint(directory, family, overrides, edit, seed)


def report(tally):
    """Prints the tally; the process's exit status (1 when a check failed)."""
    print(f"{tally.passed} passed, {len(tally.failed)} failed")
    if tally.failed:
        print("failed: " + ", ".join(tally.failed))
    return 1 if tally.failed else 0
