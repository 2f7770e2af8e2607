from draftsmith.report import write_report

RESULTS = {"target": "t", "drafter": "results/drafter", "num_speculative_tokens": 3, "temperature": 0.0,
           "max_tokens": 32, "concurrency": 2,
           "sets": {"everyday": {"prompts": 3, "decontaminated_ids": ["bench-1"], "speedup": 0.8,
                                 "baseline": {"output_tok_s": 40.0},
                                 "eagle3": {"output_tok_s": 32.0, "acceptance": {
                                     "tau_pooled": 1.234, "acceptance_rate_per_position": [0.2, 0.03, 0.004]}}}}}
STATS = {"everyday": {"records": 6, "rejected_rows": 1, "errors": 0, "retries": 2, "truncated_kept": 6,
                      "dropped_truncated": 0, "completion_tokens": 192, "latency_p50_s": 1.5, "latency_p95_s": None}}
TRAINING = {"rows": 12, "run_key": "abc", "on_cpu": True,
            "validation": [{"epoch": 0, "loss_epoch": 9.1, "full_acc_0_epoch": 0.05, "full_acc_1_epoch": 0.0},
                           {"epoch": 1, "loss_epoch": 7.2, "full_acc_0_epoch": 0.1, "full_acc_1_epoch": 0.01}]}


def test_report_shows_tau_training_and_generation_with_plots(tmp_path):
    md, png, train_png = tmp_path / "report.md", tmp_path / "acc.png", tmp_path / "train.png"
    write_report(RESULTS, STATS, TRAINING, md, png, train_png)
    text = md.read_text()
    assert "| everyday | 3 | 1.234 | 0.20, 0.03, 0.00 | 40.0 | 32.0 | 0.80× |" in text
    assert "| 2 | 7.200 | 0.100 | 0.010 |" in text
    assert "bench-1" in text and "![acceptance and throughput](acc.png)" in text and "(train.png)" in text
    assert "| everyday | 6 | 1 | 0 | 2 | 6 | 0 | 192 | 1.50 | – |" in text
    assert png.read_bytes()[:4] == train_png.read_bytes()[:4] == b"\x89PNG"
