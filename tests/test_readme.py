"""README's quickstart is code a user pastes: it must run and learn (the suite's proof that a Transformer learns a task)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_quickstart_runs_and_learns():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    quickstart = blocks[0]
    assert "model.fit" in quickstart
    namespace = {}
    exec(compile(quickstart, "README quickstart", "exec"), namespace)
    model, np = namespace["model"], namespace["np"]
    assert model.history.history["accuracy"][-1] > 0.8
    # It learned the task, not the examples: sequences it never saw come out reversed.
    unseen = np.random.default_rng(1).integers(3, 20, size=(256, 10))
    decoder_input = np.concatenate([np.ones((256, 1), int), unseen[:, ::-1][:, :-1]], axis=1)
    predicted = np.asarray(model.predict([unseen, decoder_input], verbose=0)).argmax(-1)
    assert np.mean(predicted == unseen[:, ::-1]) > 0.8
