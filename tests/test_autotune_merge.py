"""experiments.autotune: the tuning choices device calls bring back, merged across calls."""
import json

from experiments.autotune import merge_tree


def test_merge_keeps_both_calls_choices_and_never_mixes_systems(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "inductor").mkdir(parents=True)
    (new / "inductor").mkdir(parents=True)
    (old / "inductor" / "H100.json").write_text(json.dumps({"cache": {"mm_a": {"t": 1}}}))
    (new / "inductor" / "H100.json").write_text(json.dumps({"cache": {"mm_b": {"t": 2}}}))
    (new / "inductor" / "H200.json").write_text(json.dumps({"cache": {"mm_c": {"t": 3}}}))
    (old / "vtc-tuning.json").write_text(json.dumps({"system": "H100", "choices": {"k1": 1}}))
    (new / "vtc-tuning.json").write_text(json.dumps({"system": "H100", "choices": {"k2": 2}}))
    assert merge_tree(new, old) == 3
    assert json.loads((old / "inductor" / "H100.json").read_text()) == {"cache": {"mm_a": {"t": 1}, "mm_b": {"t": 2}}}
    assert json.loads((old / "inductor" / "H200.json").read_text()) == {"cache": {"mm_c": {"t": 3}}}
    assert json.loads((old / "vtc-tuning.json").read_text())["choices"] == {"k1": 1, "k2": 2}
    # choices made on another system replace the file: one system's choices are never applied on another
    (new / "vtc-tuning.json").write_text(json.dumps({"system": "H200", "choices": {"k3": 3}}))
    merge_tree(new, old)
    assert json.loads((old / "vtc-tuning.json").read_text()) == {"system": "H200", "choices": {"k3": 3}}


def test_merge_reads_the_calls_tarball(tmp_path):
    import tarfile
    (tmp_path / "autotune" / "inductor").mkdir(parents=True)
    (tmp_path / "autotune" / "inductor" / "H100.json").write_text(json.dumps({"cache": {"mm_a": {"t": 1}}}))
    with tarfile.open(tmp_path / "autotune.tgz", "w:gz") as tar:
        tar.add(tmp_path / "autotune", arcname="autotune")
    assert merge_tree(tmp_path / "autotune.tgz", tmp_path / "kept") == 1
    assert json.loads((tmp_path / "kept" / "inductor" / "H100.json").read_text()) == {"cache": {"mm_a": {"t": 1}}}
