"""The report and the card render the same records, so every fact both show reads the same: the one config, each
band's batch sizes, method and k, held or not, exact or estimate, the exported epoch. Each rule's wording comes
from the function beside the code that applies it; these tests pin the wording to the code's verdicts, so a rule
whose text changes without its code (or its code without its text) goes red here."""

import json
import re
import shlex

import pytest

from draftsmith.evaluation.decide import schedule
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.evaluation.measure import methods
from draftsmith.evaluation.measure.methods import DISPLAY_NAME
from draftsmith.evaluation.render.model_card import card
from draftsmith.evaluation.render.report import Inputs, markdown
from draftsmith.generation.server import ServerSpec
from draftsmith.training.export import basis_text, epoch_text
from tests import records
from tests.test_report import GENERATION, MERGE, PROMPTS, TRAINING, VOCAB, card_inputs

CHOSEN = {**TRAINING, "chosen": {"epoch": records.GATE["epoch"], "reason": "best simulated τ 1.900"}}


def render(results: dict, served: dict, gate: dict) -> tuple[str, str]:
    """The card and the report of one set of records."""
    text = card(card_inputs(results, serving=served, gate=gate, training=CHOSEN))
    report = markdown(Inputs(results, GENERATION, PROMPTS, MERGE, VOCAB, CHOSEN, gate, serving=served,
                             gates={"eagle3": gate}), "acc.png", "train.png", "families.png", "map.png")
    return text, report


def card_bands(text: str) -> list[tuple[int, int, str, int]]:
    """The card's first screen, band by band: first and last batch size, and the drafter's own k there."""
    screen = text.split("## What to serve")[1].split("\n## ")[0]
    out = []
    for band in screen.split("\n### ")[1:]:
        first, last = re.match(r"Batch sizes? (\d+)(?: to (\d+))?", band).groups()
        k = re.search(r"This drafter, (\d+) draft tokens?", band).group(1)
        out.append((int(first), int(last or first), band, int(k)))
    return out


def report_bands(text: str) -> list[tuple[int, int]]:
    """The report's schedule, as ``describe_bands`` words its ranges: (first batch size, k), measured ones only."""
    said = text.split("## One config for every batch size")[1].split("\n## ")[0]
    return [(int(first), int(k)) for first, k in re.findall(r"batch (\d+)(?:-\d+)?: k=(\d+)(?!, unmeasured)", said)]


@pytest.mark.parametrize("finished_before", [False, True], ids=["records now", "records of a finished project"])
def test_the_report_and_the_card_say_the_same_of_every_figure(finished_before):
    results = records.results()
    served, gate = records.serving(results), records.GATE
    if finished_before:  # no measurement is redone: what the newer fields say is read from the older ones
        results, served, gate = records.finished_before(results, served, gate)
    text, report = render(results, served, gate)
    plan = served["schedule"]
    # the one config: worded once, and what the ranking decided (n-gram beat the drafter at every band)
    winner = schedule.best_single(results["serving"], "eagle3")
    said = schedule.one_config_text(plan, results["serving"])
    assert winner == {"method": "ngram", "k": 1}
    assert said.startswith(f"{DISPLAY_NAME[winner['method']]} with {winner['k']} draft token, which needs no drafter")
    assert said in text and said in report
    if not finished_before:  # serving.json says which config won
        assert served["described"].startswith(said.removesuffix("."))
    # each band: the card's headings start where serving.json's ranges start, at the k they serve
    bands = card_bands(text)
    starts = [r[0] for r in plan["ranges"]]
    assert [first for first, *_ in bands] == starts
    assert [(first, k) for first, _, _, k in bands] == [(first, k) for first, _, k in plan["ranges"]]
    assert report_bands(report) == [(first, k) for first, _, k in plan["ranges"]]
    assert [(first, last) for first, last, *_ in bands] == [(b["first"], b["last"]) for b in schedule.bands(
        plan, results["concurrency"])]
    if not finished_before:
        assert starts == [1, 11]  # the engine ran 10.8 at concurrency 12
    # the winner's command comes first in each band, the drafter's after it
    for *_, band, _ in bands:
        assert band.index('"method": "ngram"') < band.index('"method": "eagle3"')
    # held or not: the same cell, the same why, the same rule
    if not finished_before:
        assert f"did not hold this concurrency: {records.NOT_HELD}." in text and records.NOT_HELD in report
    assert ev.held_rule_text() in text and ev.held_rule_text() in report
    # exact or estimate, and the exported epoch as the records count it
    basis = basis_text(gate["predicted"]["exactness"])
    assert basis.startswith("estimate") and basis in text and basis in report
    exported = epoch_text(CHOSEN["chosen"]["epoch"])
    assert f"Exported {exported}" in text and f"**Exported: {exported}**" in report
    assert exported == epoch_text(records.GATE["epoch"]) and '"epoch": 2' in exported


def test_the_held_rule_reads_as_the_code_judges():
    """The held rule's wording against :func:`evaluate.hold`'s verdicts: the report once said a cell held where
    "the engine's peak reached 0.9 of the concurrency", and the code compared the engine's mean with the target
    alone's."""
    text = ev.held_rule_text()
    assert f"the client kept {ev.HELD:g} of the concurrency in flight" in text
    assert f"the engine ran {ev.HELD:g} of the target alone's mean running count" in text
    c, alone = 12, {"mean_in_flight": 12.0, "mean_running": 8.0}
    # the engine's mean at the share the text names of the target alone's holds, far below the concurrency
    assert ev.hold({"mean_in_flight": 12.0, "mean_running": ev.HELD * 8.0}, alone, c) is None
    assert ev.hold({"mean_in_flight": 12.0, "mean_running": ev.HELD * 8.0 - 0.01}, alone, c)
    # the client: the share of the concurrency the text names; the target alone's client too
    assert ev.hold({"mean_in_flight": ev.HELD * c}, None, c) is None
    assert ev.hold({"mean_in_flight": ev.HELD * c - 0.01}, None, c)
    assert ev.hold({"mean_in_flight": 12.0}, {"mean_in_flight": ev.HELD * c - 0.01}, c)


def test_the_cards_first_screen_says_what_to_serve_in_short_notes():
    """The card took 136 lines to say what to serve: the first command, at line 27, was the drafter's, and the
    paragraph after it said n-gram beat it; one sentence ran to 81 words."""
    results = records.results()
    text, _ = render(results, records.serving(results), records.GATE)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("vllm serve"))
    assert first < 40 and '"method": "ngram"' in lines[first]
    prose = [line for line in lines if line and not line.startswith(("|", "vllm", "python", "  --", "```", "#"))]
    screen = text.split("## What to serve")[1].split("\n## ")[0]
    notes = [line for line in screen.splitlines() if line.startswith(("Held:", "EAGLE-3 1 draft token did not"))]
    assert len(notes) == 2 and all(len(note.split()) <= 30 and note.count(".") <= 3 for note in notes)
    assert max(len(sentence.split()) for line in prose for sentence in re.split(r"(?<=[.!?])\s", line)) <= 50


def test_a_cpus_ranking_reads_the_same_in_both_and_as_the_code_ranks():
    from draftsmith.core import platform
    from draftsmith.evaluation.decide.pick import FIGURES

    results = {**records.results(), "on_accelerator": False}
    text, report = render(results, records.serving(results), records.GATE)
    said = platform.cpu_ranking_text()
    assert said in text and said in report
    assert f"ranked by {FIGURES[platform.ranking_figure('speedup', 'cpu')]}" in said
    assert platform.ranking_figure("speedup", "cuda") == "speedup"


def test_the_load_rule_reads_as_the_code_flags():
    from draftsmith.evaluation.decide import pick

    said = pick.load_changed_text()
    assert f"more than {pick.LOAD_TOLERANCE:.0%} apart" in said

    def measured(tok_s: float) -> dict:
        return {"baseline": [{"concurrency": 4, "runs": [{"set": "s", "temperature": 0.0, "output_tok_s": tok_s}]}]}

    edge = 40.0 * (1 + pick.LOAD_TOLERANCE)
    assert not pick.load_changes({"a": measured(40.0), "b": measured(edge - 0.01)})
    assert pick.load_changes({"a": measured(40.0), "b": measured(edge + 0.01)})


# A GPU project's engine flags: tensor parallelism, a reasoning parser, a context, and tool sets measured with the
# target's tool-call parser.
GPU_SERVER = {"max_model_len": 32768, "extra_args": ["--tensor-parallel-size", "8", "--reasoning-parser", "qwen3"]}
GPU_FLAGS = (["--tensor-parallel-size", "8"], ["--reasoning-parser", "qwen3"], ["--max-model-len", "32768"],
             ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], ["--trust-remote-code"])


def commands(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.startswith("vllm serve")]


def carries(args: list[str], flags: list[str]) -> bool:
    """Whether ``args`` hold ``flags`` side by side (a flag with its value)."""
    return any(args[i:i + len(flags)] == flags for i in range(len(args)))


def test_every_command_the_card_and_serving_json_give_serves_as_measured():
    flags = methods.served_flags(GPU_SERVER, trust_remote_code=True, tools={"tool_call_parser": "hermes"})
    results = records.results()
    served = records.serving(results)
    text = card(card_inputs(results, serving=served, gate=records.GATE, training=CHOSEN, served_flags=flags))
    given = commands(text)
    configs = [json.loads(args[args.index("--speculative-config") + 1]) for args in given
               if "--speculative-config" in args]
    assert len(given) >= 3 and served["speculative_config"] in configs  # serving.json's config, served as measured
    drafter = served["speculative_config"]["model"]
    for args in given:
        assert args[:3] == ["vllm", "serve", "b/m"] and all(carries(args, flags) for flags in GPU_FLAGS), args
        if "--speculative-config" in args:
            config = json.loads(args[args.index("--speculative-config") + 1])
            assert config.get("model", drafter) == drafter  # the drafter's path is serving.json's
    # a finished project's records give the same commands
    old = card(card_inputs(results, serving=records.finished_before(results, served, records.GATE)[1],
                           gate=records.GATE, training=CHOSEN, served_flags=flags))
    assert commands(old) == given


def test_a_cpu_projects_commands_carry_none_of_the_flags_its_machine_added():
    cpu = ServerSpec(model="m", max_model_len=2048, cpu_only=True, dtype="bfloat16")
    assert "--enforce-eager" in cpu.command(8000) and cpu.served_flags() == ["--max-model-len", "2048"]
    flags = methods.served_flags({"max_model_len": 2048, "extra_args": []}, trust_remote_code=False)
    results = records.results()
    text = card(card_inputs(results, serving=records.serving(results), served_flags=flags))
    for args in commands(text):
        assert args[3:] == ["--max-model-len", "2048"] or args[5:] == ["--max-model-len", "2048"], args


def test_the_pages_format_the_recorded_bands_and_first_settings_and_decide_neither():
    """The card drew its bands from the schedule's ranges and chose the setting to serve before the drafter
    itself, each time it rendered: the schedule now records its bands (``serving.json`` carries them) and the
    pick the setting each band serves first, and the card formats those records."""
    from draftsmith.evaluation.decide import pick

    results = records.results()
    served = records.serving(results)
    plan = served["schedule"]
    assert plan["bands"] == results["schedule"]["bands"]
    older = schedule.bands(records.finished_before(results, served, records.GATE)[1]["schedule"],
                           results["concurrency"])  # drawn from the ranges: the same batch sizes
    assert [(b["first"], b["last"]) for b in older] == [(b["first"], b["last"]) for b in plan["bands"]]
    for entry in results["serving"]:
        assert entry["serve_first"] == pick.first_to_serve(entry, "eagle3", True)
        assert entry["serve_first"]["method"] == "ngram"
    # a record that says otherwise is what the card shows: it decides nothing of its own
    plan["bands"][1] = {**plan["bands"][1], "first": 9}
    plan["bands"][0] = {**plan["bands"][0], "last": 8}
    results["serving"][1]["serve_first"] = None
    text, _ = render(results, served, records.GATE)
    bands = card_bands(text)
    assert [(first, last) for first, last, *_ in bands] == [(1, 8), (9, 12)]
    assert '"method": "ngram"' in bands[0][2] and '"method": "ngram"' not in bands[1][2]


def test_the_report_and_status_say_the_training_records_choice():
    """The report worded the predicted served τ from the first epoch's entry, and why there was none from the
    epochs' entries again; ``./run.sh status`` formats training.json's ``chosen``. Both now format ``chosen``."""
    from draftsmith.ops.status import chosen_by

    first = {"basis": "estimate", "agreement": 0.874, "positions": 900}
    exported = {"basis": "estimate", "agreement": 0.95, "positions": 900}
    validation = [{**e, "epoch": i, "predicted_served": {"rows": 20, "k": 1 + 2 * i, "tokens_per_step": 1.3 + i,
                                                        "exactness": exported if i else first}}
                  for i, e in enumerate([TRAINING["validation"][0]] * 2)]
    chosen = {"epoch": 1, "predicted_served_tau": 2.3, "k": 3, "exactness": exported, "reason": "best predicted"}

    def report_of(training: dict) -> str:
        return markdown(Inputs(records.results(), GENERATION, PROMPTS, MERGE, VOCAB, training, records.GATE),
                        "acc.png", "train.png", "families.png", "map.png")

    said = report_of({**TRAINING, "validation": validation, "chosen": chosen})
    basis = basis_text(exported)
    assert f"Predicted served τ at k=3: {basis}" in said and basis in chosen_by(chosen)
    missing = {"epoch": 0, "simulated_tau": 1.15, "predicted_missing": "no rows to replay", "reason": "best simulated"}
    skipped = [{**e, "predicted_served_skipped": "skipped: online hidden states"} for e in TRAINING["validation"]]
    said = report_of({**TRAINING, "validation": skipped, "chosen": missing})
    assert "No predicted served τ: no rows to replay;" in said and "no rows to replay" in chosen_by(missing)


def test_the_gates_window_is_the_records():
    """The card and the report said the gate served up to 64 tokens each, the constant of today's code, where
    ``gate.json`` records the window it served; a gate from before it was recorded served that constant."""
    from draftsmith.training.export import GATE_WINDOW

    results = records.results()
    text, report = render(results, records.serving(results), {**records.GATE, "window": 32})
    assert "up to 32 tokens each" in text and "(up to 32 tokens each)" in report
    text, report = render(results, records.serving(results), records.GATE)
    assert f"up to {GATE_WINDOW} tokens each" in text and f"(up to {GATE_WINDOW} tokens each)" in report


@pytest.mark.parametrize("accelerator", [True, False], ids=["GPU", "CPU"])
def test_the_first_screens_rule_reads_as_the_pick_chooses(accelerator):
    """The card said "in each band the setting measured best comes first", and put n-gram first where another
    trained family had ranked above it. The rule's words now come from beside :func:`pick.first_to_serve`; here
    they are read back as a rule and held to its verdicts."""
    from draftsmith.evaluation.decide import pick

    said = pick.serve_first_text(accelerator)
    assert "best-ranked setting that needs no drafter" in said and "where it ranked above this drafter" in said
    plain_counts = "plain serving" in said

    def cell(method: str) -> dict:
        return {"method": method, "k": 1, "trained": method in ("eagle3", "dflash")}

    for order in (["dflash", "ngram", "plain", "eagle3"], ["eagle3", "ngram"], ["plain", "eagle3", "ngram"],
                  ["plain", "ngram", "eagle3"], ["ngram", "plain"], ["dflash", "eagle3", "plain"]):
        ranked = [cell(m) for m in order]
        needs_none = [c for c in ranked if not c["trained"] and (plain_counts or c["method"] != "plain")]
        ours = next((i for i, c in enumerate(ranked) if c["method"] == "eagle3"), len(ranked))
        expected = needs_none[0] if needs_none and ranked.index(needs_none[0]) < ours else None
        assert pick.first_to_serve({"ranked": ranked}, "eagle3", accelerator) == expected, order
    text, _ = render(records.results(), records.serving(records.results()), records.GATE)
    assert pick.serve_first_text(True) in text


def sections(report: str, heading: str) -> str:
    return report.split(f"## {heading}")[1].split("\n## ")[0]


def test_tool_use_and_derived_lengths_are_the_picks_records():
    """The report derived shorter draft lengths and the card counted tool calls from the measured runs each time
    they rendered: the pick now records both in results.json, and the pages format the record. A finished project's
    results, without them, render the same figures, decided from its measured runs by the same function."""
    from draftsmith.evaluation.decide import pick

    results = records.results()
    assert results["derived_lengths"] == pick.derived_lengths(results["methods"])
    assert results["tool_use"] == pick.tool_use(results["methods"]) == {}
    served = records.serving(results)
    _, report = render(results, served, records.GATE)
    older = records.finished_before(results, served, records.GATE)
    assert sections(render(*older)[1], "Shorter draft lengths") == sections(report, "Shorter draft lengths")
    # a record that says otherwise is what the pages show: they decide neither
    results["derived_lengths"] = [{**results["derived_lengths"][0], "derived": 9.876}]
    results["tool_use"] = {"chat": {"requests_with_tools": 7, "tool_calls": 0}}
    text, report = render(results, served, records.GATE)
    assert "| EAGLE-3 | 1 | 1 | 9.876 | 1.500 |" in report and "| 1.720 |" not in report
    for page in (text, report):
        assert "chat: 0 tool calls in 7 requests with tools" in page


def test_the_readings_are_worded_as_each_run_recorded_them():
    """The report said the engine's count was read every 0.5 s where ``SAMPLE_S`` was 0.25: it worded today's
    constant. Each run now records the interval it was read at and the readings a window needs, and the report
    words those; runs from before they were recorded read as today's."""
    run = ev.SetRun(prompts=4, concurrency=2, sent=4, completed=4, output_tokens=40, window_s=1.0, in_flight=2.0)
    assert {key: run.as_dict()[key] for key in ("sample_s", "min_readings")} == \
        {"sample_s": ev.SAMPLE_S, "min_readings": ev.MIN_READINGS}
    results = records.results()
    served = records.serving(results)
    for measured in pick_runs(results):
        measured.update(sample_s=0.5, min_readings=6)
    _, report = render(results, served, records.GATE)
    said = ev.readings_text(pick_runs(results))
    assert said == "The engine's count is read every 0.5 s; a window read fewer than 6 times is sent more rounds " \
                   "until it is." and said in report
    pick_runs(results)[0]["sample_s"] = 0.25
    assert "read every 0.25 s or 0.5 s;" in render(results, served, records.GATE)[1]
    older = records.finished_before(results, served, records.GATE)
    assert f"read every {ev.SAMPLE_S:g} s; a window read fewer than {ev.MIN_READINGS} times" in render(*older)[1]


def pick_runs(results: dict) -> list[dict]:
    from draftsmith.evaluation.decide import pick

    return pick.measured_runs(results["methods"])


def test_the_gates_flags_are_worded_from_the_thresholds_it_recorded():
    """The report and the card worded the gate's flag from today's PREDICTED_SHARE, ABOVE_SHARE and
    FLAG_MIN_ACCEPTED: gate.json now records the thresholds it flagged by, the pages word those, and the rule's
    text reads as :func:`off_prediction` flags."""
    from draftsmith.training import export as ex

    now = ex.flag_thresholds()
    below, above, least, z = now["predicted_share"], now["above_share"], now["flag_min_accepted"], now["sampled_z"]
    assert (below, above, least, z) == (ex.PREDICTED_SHARE, ex.ABOVE_SHARE, ex.FLAG_MIN_ACCEPTED, ex.SAMPLED_Z)
    said = ex.flag_rule_text(now)
    assert f"below {below:g} or above {above:g} of its prediction" in said and f"accepts {least} drafts" in said
    assert ex.off_prediction(below * 0.5, 0.5, least) is False and ex.off_prediction(above * 0.5, 0.5, least) is False
    assert ex.off_prediction(below * 0.5 - 1e-6, 0.5, least) == "below"
    assert ex.off_prediction(above * 0.5 + 1e-6, 0.5, least) == "above"
    assert ex.off_prediction(0.1, 0.5, least - 0.5) is None
    assert ex.off_prediction(0.3, 0.5, least, spread=0.2 / z) is False  # within z standard errors of the gap
    results = records.results()
    served = records.serving(results)
    recorded = {"predicted_share": 0.7, "above_share": 1.5, "flag_min_accepted": 5, "sampled_z": 2.0}
    positions = [{**records.GATE["positions"][0], "ratio": 0.6, "flag": True, "direction": "below"},
                 *records.GATE["positions"][1:]]
    gate = {**records.GATE, "thresholds": recorded, "positions": positions}
    text, report = render(results, served, gate)
    assert ex.flag_rule_text(recorded) in report and "within 2 standard errors" in report
    for page in (text, report):
        assert "**below 0.7**" in page and f"**below {below:g}**" not in page
    gate.pop("thresholds")  # a gate from before they were recorded: today's
    text, report = render(results, served, gate)
    assert said in report and f"within {z:g} standard errors" in report
    assert f"**below {below:g}**" in text
