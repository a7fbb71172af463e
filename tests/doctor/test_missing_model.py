"""`g906 doctor --recipe R` with a missing model file: the Model files row fails, and the checks
that need the file's contents (architecture, GGUF tensor types, memory) are skipped with that
reason instead of failing again with what an absent file cannot say."""

from __future__ import annotations

import json

from tests.doctor.test_cli import HEALTHY, HEALTHY_PROBE, Machine, g906, saved_facts


def test_missing_model_file_is_one_failure_and_reasoned_skips(tmp_path):
    facts = saved_facts(tmp_path, Machine(**HEALTHY), HEALTHY_PROBE)
    for source in ("models/absent-Q4_K_M.gguf", "models/absent-hf-dir"):
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(f'[model]\nsource = "{source}"\n')
        cp = g906("doctor", "--from", str(facts), "--recipe", str(recipe), "--json")
        doc = json.loads(cp.stdout)
        rows = {c["id"]: c for c in doc["checks"]}
        assert rows["recipe.model_files"]["status"] == "fail", source
        for cid in ("recipe.architecture", "recipe.memory") + (("recipe.gguf_types",) if source.endswith(".gguf") else ()):
            assert rows[cid]["status"] == "skip", (source, cid, rows[cid])
            assert "model file is missing" in rows[cid]["summary"] and "absent" in rows[cid]["summary"]
        text = json.dumps(doc)
        for noise in ("architecture None", "no tensor types known", "about 0 KiB"):
            assert noise not in text, (source, noise)
        human = g906("doctor", "--from", str(facts), "--recipe", str(recipe))
        assert "architecture None" not in human.stdout and "0 KiB" not in human.stdout
        assert human.returncode == 1 and "Traceback" not in human.stderr
