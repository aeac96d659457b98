"""pass@k for HumanEval with a local executor, instead of lm-eval's ``evaluate.load("code_eval")``,
which fetches its metric script from the Hugging Face Hub and so fails offline.

Each candidate program runs with its tests in a fresh Python subprocess, in a temporary folder, with a
timeout. This executes model-written code: the task is marked ``unsafe_code``, so lm-eval (and
``cli.py sweep``) run it only with ``confirm_run_unsafe_code``.
"""
import math
import subprocess
import sys
import tempfile

TIMEOUT_S = 10.0


def passes(program: str, timeout: float = TIMEOUT_S) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], cwd=folder, capture_output=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def estimate_pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. (2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k(references: list[str], predictions: list[list[str]], k: list[int] | int = 1) -> float:
    """lm-eval metric hook: one document's tests and candidate completions -> pass@k (the first k)."""
    k = k[0] if isinstance(k, (list, tuple)) else int(k)
    scores = []
    for test, candidates in zip(references, predictions):
        correct = sum(passes(f"{candidate}\n{test}\n") for candidate in candidates)
        scores.append(estimate_pass_at_k(len(candidates), correct, k))
    return sum(scores) / len(scores)


def build_predictions(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Prompt + completion: the whole function the tests call."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]
