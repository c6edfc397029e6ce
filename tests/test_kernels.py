"""Tuned CPU linear layers: every strategy computes the same product, the stock path is untouched outside the
engine, copies and caches behave."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from specdec_cli.runtime import kernels, products

from conftest import tiny_llama


def fast(linear, strategy):
    return kernels.FastLinear(linear, {b: strategy for b in kernels.BUCKETS})


@pytest.mark.parametrize("strategy", kernels.STRATEGIES)
@pytest.mark.parametrize("bias", [False, True])
def test_every_strategy_computes_the_linear_product(strategy, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 80, bias=bias)
    layer = fast(linear, strategy)
    for n in (1, 2, 3, 5, 17, 64, 65, 130):
        x = torch.randn(1, n, 48)
        with torch.inference_mode(), kernels.active():
            got = layer(x)
        assert got.shape == (1, n, 80) and got.is_contiguous()
        assert torch.allclose(got, F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5), n


@pytest.mark.skipif(not products._POINTWISE, reason="this torch has no oneDNN pointwise linear")
def test_the_packed_onednn_product_has_the_inner_products_bits():
    """``mkldnn`` multiplies dense rows by a weight packed once (no conversions per product): the bits of oneDNN's
    inner product on converted rows, which plans and recorded outputs were measured with, from 3 rows on (the plans
    of this project's machines use ``mkldnn`` from 17 rows on; at 1 row oneDNN takes another kernel)."""
    torch.manual_seed(0)
    for out_f, in_f in ((576, 576), (192, 576), (576, 1536)):
        w = torch.randn(out_f, in_f)
        packed, copy_w = products.pack("mkldnn", w), w.to_mkldnn()
        for n in (3, 17, 65, 130, 520):
            x = torch.randn(n, in_f)
            assert torch.equal(products.mkldnn(x, packed),
                               torch._C._nn.mkldnn_linear(x.to_mkldnn(), copy_w, None).to_dense()), (out_f, in_f, n)


def test_outside_the_engine_it_is_exactly_nn_linear():
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 64)
    layer = fast(linear, "tn")
    x = torch.randn(2, 3, 32)
    assert torch.equal(layer(x), linear(x))


def test_deepcopy_gives_plain_linears_and_keeps_ties():
    model = tiny_llama(vocab=16)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    for parent, name, layer in kernels._linears(model):
        setattr(parent, name, fast(layer, "wt"))
    clone = copy.deepcopy(model)
    assert not any(isinstance(m, kernels.FastLinear) for m in clone.modules())
    assert clone.lm_head.weight is clone.model.embed_tokens.weight
    assert torch.equal(clone.lm_head.weight, model.lm_head.weight)


def test_install_measures_once_and_keeps_the_logits(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    model = tiny_llama(vocab=16)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    summary = kernels.install(model)
    assert summary["layers"] == len([m for m in model.modules() if isinstance(m, kernels.FastLinear)]) > 0
    assert (tmp_path / "kernels" / "plans.json").exists()
    with torch.inference_mode(), kernels.active():
        after = model(input_ids=ids).logits
    assert torch.allclose(before, after, rtol=1e-5, atol=1e-5)

    again = tiny_llama(vocab=16)
    monkeypatch.setattr(kernels, "tune_shape", lambda *a, **k: pytest.fail("re-tuned a cached shape"))
    kernels.install(again)
    uninstall(again)
    assert not any(isinstance(m, kernels.FastLinear) for m in again.modules())


def test_bucket_of():
    assert [kernels.bucket_of(n) for n in (1, 2, 5, 7, 9, 64, 65, 500)] == [1, 2, 6, 8, 12, 64, 256, 256]


def uninstall(model) -> None:
    """Put plain ``nn.Linear`` layers back (the same weights)."""
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if isinstance(child, kernels.FastLinear):
                plain = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                plain.weight = child.weight
                if child.bias is not None:
                    plain.bias = child.bias
                setattr(parent, name, plain)


@pytest.mark.parametrize("threads", [2, 3])
def test_tiles_split_over_threads_give_the_one_thread_bits(threads):
    """`dot` over several threads (runtime.dot.dot_rows_threads: the outputs split at multiples of the tile's
    width) computes every output with the tile it gets in one thread: the same bits, for any row count, and for
    output counts that leave a remainder of single-output tiles."""
    import numpy as np

    from specdec_cli.runtime.dot import dot_rows, dot_rows_threads, spans
    from specdec_cli.runtime.tiles import OUTS

    rng = np.random.default_rng(0)
    for rows, k_dim, n_out in [(1, 64, 96), (2, 48, 10), (5, 32, 33), (8, 96, 130), (3, 16, 3)]:
        cuts = spans(n_out, threads)
        assert cuts[0][0] == 0 and cuts[-1][1] == n_out and all(a % OUTS == 0 for a, _ in cuts)
        assert all(b == c for (_, b), (c, _) in zip(cuts, cuts[1:]))
        x = rng.standard_normal((rows, k_dim)).astype(np.float32)
        w = rng.standard_normal((n_out, k_dim)).astype(np.float32)
        one, split = np.empty((rows, n_out), np.float32), np.empty((rows, n_out), np.float32)
        dot_rows(x, w, one)
        dot_rows_threads(x, w, split, threads)
        assert np.array_equal(one, split)


def test_split_on_the_openmp_pool_and_by_the_executor_give_the_same_bits(monkeypatch):
    """A split product runs on numba's OpenMP pool where its threading layer may be entered from several threads,
    else on the executor: either way the one-thread bits."""
    import numpy as np

    from specdec_cli.runtime import dot

    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    w = rng.standard_normal((70, 40)).astype(np.float32)
    one, pool, executor = (np.empty((9, 70), np.float32) for _ in range(3))
    dot.dot_rows(x, w, one)
    dot.dot_rows_threads(x, w, pool, 2)
    if dot.COMPILED:  # decided at the first split: the pool where numba's layer may be shared (omp here)
        assert dot._PARTS[0] is (dot.numba.threading_layer() in ("omp", "tbb"))
    monkeypatch.setattr(dot, "_PARTS", [False])
    dot.dot_rows_threads(x, w, executor, 2)
    assert np.array_equal(one, pool) and np.array_equal(one, executor)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_splits_products_after_its_parent_used_the_pool():
    """GNU OpenMP's pool may not be entered after a fork (numba's omp layer terminates such a child): a child
    forked after the parent split a product splits by the executor, and gets the same bits."""
    import numpy as np

    from specdec_cli.runtime import dot

    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal((96, 64)).astype(np.float32)
    one, parent = np.empty((8, 96), np.float32), np.empty((8, 96), np.float32)
    dot.dot_rows(x, w, one)
    dot.dot_rows_threads(x, w, parent, 2)
    pid = os.fork()
    if pid == 0:  # the child: a split, then its verdict as the exit status (never return into pytest)
        try:
            child = np.empty((8, 96), np.float32)
            dot.dot_rows_threads(x, w, child, 2)
            os._exit(0 if np.array_equal(child, one) and dot._PARTS[0] is False else 1)
        except BaseException:  # noqa: BLE001
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert np.array_equal(parent, one)


def test_a_row_gets_the_one_row_bits_in_every_tile_height():
    """float32 rows through every tile shape (1 and 2 rows, and on AVX-512 the tall 4- and 8-row tiles with two
    outputs per register): each row's outputs are those of a one-row product, for row counts that mix the heights,
    K with and without leftovers past the 8-lane chunks, and output counts with single-output tiles."""
    import numpy as np

    from specdec_cli.runtime import tiles
    from specdec_cli.runtime.dot import dot_rows

    print(f"tall tiles on this machine: {tiles.TALL if tiles.COMPILED else False}")  # else 2-row tiles only
    rng = np.random.default_rng(2)
    for k_dim, n_out in [(64, 12), (72, 9), (13, 6), (100, 17), (5, 8)]:
        w = rng.standard_normal((n_out, k_dim)).astype(np.float32)
        x = rng.standard_normal((19, k_dim)).astype(np.float32)
        alone = np.empty((19, n_out), np.float32)
        for r in range(19):
            dot_rows(x[r: r + 1], w, alone[r: r + 1])
        for rows in (2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 19):
            together = np.empty((rows, n_out), np.float32)
            dot_rows(x[:rows], w, together)
            assert np.array_equal(together, alone[:rows]), (k_dim, n_out, rows)


def test_openmp_workers_spin_briefly_unless_the_user_chose(tmp_path):
    """Importing specdec bounds OpenMP's spin (GOMP_SPINCOUNT) before torch loads OpenMP: workers that spin long
    took the core the split tiles need, workers asleep at once made every MKL call wake them. It leaves either
    variable alone when the user set one, does nothing once torch is loaded, and nothing in the vLLM processes it
    gave the user's setting back to. The kernel plans are keyed by the setting."""
    import os
    import subprocess
    import sys

    import specdec_cli
    from specdec_cli.runtime import machine

    code = ("import specdec_cli, os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('SPECDEC_SET_OMP_WAIT_POLICY'))")
    mine = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SPECDEC_SET_OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in mine}

    def run(script, **extra):
        return subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.split()

    assert run(code) == [specdec_cli.OPENMP_SPINS, "None", "1"]
    assert run(code, OMP_WAIT_POLICY="PASSIVE") == ["None", "PASSIVE", "None"]
    assert run(code, GOMP_SPINCOUNT="0") == ["0", "None", "None"]
    assert run("import torch\n" + code) == ["None", "None", "None"]  # OpenMP already loaded
    assert run(code, SPECDEC_SET_OMP_WAIT_POLICY="0") == ["None", "None", "0"]  # a vLLM process spawned by us
    key = "import specdec_cli\nfrom specdec_cli.runtime import kernels\nprint(kernels.machine_key())"
    assert f"omp -/{specdec_cli.OPENMP_SPINS}|" in " ".join(run(key))
    assert "omp PASSIVE/-|" in " ".join(run(key, OMP_WAIT_POLICY="PASSIVE"))  # plans measured under each setting
    assert machine.openmp_waits() in machine.setup_key()
    given_back = ("import specdec_cli, os\nfrom specdec_cli.runtime import machine\nos.environ.pop('GOMP_SPINCOUNT')\n"
                  "print(machine.openmp_waits())")  # as a vLLM engine's start does: OpenMP read it already
    assert " ".join(run(given_back)) == f"omp -/{specdec_cli.OPENMP_SPINS}"
