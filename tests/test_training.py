"""Schedule, loss, metrics, and training under MirroredStrategy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from helpers import assert_same_weights
from keras_transformer import training

SMALL = dict(src_vocab_size=30, tgt_vocab_size=40, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=20, dropout=0.0)


def test_schedule_follows_equation_3():
    schedule = training.TransformerSchedule(d_model=512, warmup_steps=4000)
    # Keras counts optimizer steps from 0; the paper from 1.
    np.testing.assert_allclose(float(schedule(0)), 512**-0.5 * 4000**-1.5, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(3999)), 512**-0.5 * 4000**-0.5, rtol=1e-5)  # the peak
    np.testing.assert_allclose(float(schedule(39999)), 512**-0.5 * 40000**-0.5, rtol=1e-5)
    assert float(schedule(1999)) < float(schedule(3999)) > float(schedule(5999))
    doubled = training.TransformerSchedule(d_model=512, warmup_steps=4000, scale=2.0)
    np.testing.assert_allclose(float(doubled(100)), 2 * float(schedule(100)), rtol=1e-6)
    assert training.TransformerSchedule.from_config(schedule.get_config()).get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="must be positive"):
        training.TransformerSchedule(d_model=512, warmup_steps=0)


def test_optimizer_is_the_papers_adam():
    optimizer = training.transformer_optimizer(d_model=512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def random_logits(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32") * 3


def test_label_smoothed_loss_matches_its_formula():
    labels = np.array([[4, 2, 7, 0, 0]])
    logits = random_logits((1, 5, 9))
    loss = float(training.MaskedSparseCrossEntropy(label_smoothing=0.1)(labels, logits))
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = [-(0.9 * log_probs[0, t, labels[0, t]] + 0.1 * log_probs[0, t].mean()) for t in range(3)]
    np.testing.assert_allclose(loss, np.mean(per_token), rtol=1e-5)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_hand_written_loss_gradient_matches_automatic_differentiation(label_smoothing):
    """The loss's value and gradient equal the straightforward log-softmax formula, autodiffed."""
    labels = tf.constant([[4, 2, 7, 0, 8], [1, 1, 3, 5, 0]])
    logits = random_logits((2, 5, 9))
    logits[1, 2, 3] += 200.0  # far apart: exp would overflow, a naive softmax underflows
    logits = tf.constant(logits)
    weights = tf.constant(np.random.default_rng(2).uniform(size=(2, 5)).astype("float32"))

    def straightforward(logits):
        log_probs = tf.nn.log_softmax(logits)
        picked = tf.gather(log_probs, labels, batch_dims=2)
        return -((1 - label_smoothing) * picked + label_smoothing * tf.reduce_mean(log_probs, -1))

    values, gradients = [], []
    for function in (straightforward, lambda x: training.token_cross_entropy(labels, x, label_smoothing)):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            per_token = function(logits)
            total = tf.reduce_sum(per_token * weights)  # a different upstream gradient per position
        values.append(per_token.numpy())
        gradients.append(tape.gradient(total, logits).numpy())
    assert np.all(np.isfinite(values[1])) and np.all(np.isfinite(gradients[1]))
    np.testing.assert_allclose(values[1], values[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gradients[1], gradients[0], atol=1e-6)


def test_loss_ignores_padding():
    loss = training.MaskedSparseCrossEntropy()
    labels = np.array([[4, 2, 7, 3, 0], [5, 3, 0, 0, 0]])
    logits = random_logits((2, 5, 9))
    padded_labels = np.pad(labels, ((0, 0), (0, 4)))
    padded_logits = np.concatenate([logits, random_logits((2, 4, 9), seed=1)], axis=1)
    np.testing.assert_allclose(float(loss(padded_labels, padded_logits)), float(loss(labels, logits)), rtol=1e-6)
    # Averaged over real tokens (6), not over positions (10) or rows (2).
    per_token = training.token_cross_entropy(labels, logits, 0.1).numpy()
    np.testing.assert_allclose(float(loss(labels, logits)), per_token[labels != 0].mean(), rtol=1e-6)


def test_model_loss_is_the_same_with_extra_padding():
    model = kt.models.Transformer(**SMALL)
    rng = np.random.default_rng(0)
    source, target = rng.integers(1, 30, (3, 6)), rng.integers(1, 40, (3, 7))
    target[2, 4:] = 0
    loss = training.MaskedSparseCrossEntropy()
    plain = float(loss(target[:, 1:], model((source, target[:, :-1]))))
    padded_target = np.pad(target, ((0, 0), (0, 5)))
    padded_source = np.pad(source, ((0, 0), (0, 3)))
    padded = float(loss(padded_target[:, 1:], model((padded_source, padded_target[:, :-1]))))
    np.testing.assert_allclose(padded, plain, rtol=1e-5)


def test_metrics_count_real_tokens_only():
    labels = np.array([[1, 2, 0, 0]])
    logits = np.full((1, 4, 3), -5.0, "float32")
    logits[0, 0, 1] = 5.0  # right
    logits[0, 1, 1] = 5.0  # wrong (label 2)
    logits[0, 2:, 0] = 5.0  # "right" on padding: must not count
    accuracy = training.MaskedAccuracy()
    accuracy.update_state(labels, logits)
    assert float(accuracy.result()) == 0.5
    perplexity = training.Perplexity()
    perplexity.update_state(labels, logits)
    nll = training.token_cross_entropy(labels, logits).numpy()[0, :2].mean()
    np.testing.assert_allclose(float(perplexity.result()), np.exp(nll), rtol=1e-5)


def uneven_batch():
    """Eight pairs: the first four long, the last four mostly padding."""
    rng = np.random.default_rng(3)
    source = rng.integers(4, 30, (8, 9))
    target = rng.integers(4, 40, (8, 10))
    source[4:, 3:] = 0
    target[4:, 3:] = 0
    return (source, target[:, :-1]), target[:, 1:]


def one_sgd_step(strategy, initial_weights):
    with strategy.scope():
        model = kt.models.Transformer(**SMALL)
        model.build(((None, None), (None, None)))
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=training.MaskedSparseCrossEntropy(0.1))
    inputs, labels = uneven_batch()
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(8)
    history = model.fit(dataset, epochs=1, shuffle=False, verbose=0)
    # With SGD at learning rate 1, the weight change is the gradient.
    gradients = [before - after for before, after in zip(initial_weights, model.get_weights())]
    return history.history["loss"][0], gradients


def test_two_replicas_give_the_single_device_loss_and_gradients(mirrored_strategy):
    reference = kt.models.Transformer(**SMALL)
    reference.build(((None, None), (None, None)))
    initial = reference.get_weights()
    single_loss, single_gradients = one_sgd_step(tf.distribute.get_strategy(), initial)
    assert mirrored_strategy.num_replicas_in_sync == 2
    mirrored_loss, mirrored_gradients = one_sgd_step(mirrored_strategy, initial)
    np.testing.assert_allclose(mirrored_loss, single_loss, rtol=1e-5)
    for single, mirrored in zip(single_gradients, mirrored_gradients):
        np.testing.assert_allclose(mirrored, single, atol=1e-5)
    assert max(np.abs(g).max() for g in single_gradients) > 1e-3  # a real step was taken


def test_the_loss_is_exact_under_two_replicas_for_a_model_without_a_keras_mask(mirrored_strategy):
    # Keras' own reduction divides a replica's loss by the number of replicas only when the
    # model's output carries a mask; ours does not depend on it: the logged loss and the
    # trained weights are a single device's.
    rng = np.random.default_rng(0)
    tokens, labels = rng.integers(1, 30, (64, 6)), rng.integers(0, 40, (64, 6))  # label 0: padding
    results = []
    for strategy in (tf.distribute.get_strategy(), mirrored_strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((6,)), keras.layers.Embedding(30, 8), keras.layers.Dense(40)])
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss=training.MaskedSparseCrossEntropy(0.1))
        history = model.fit(tf.data.Dataset.from_tensor_slices((tokens, labels)).batch(16), epochs=2, verbose=0)
        results.append((history.history["loss"], model.get_weights()))
    (single_loss, single_weights), (mirrored_loss, mirrored_weights) = results
    np.testing.assert_allclose(mirrored_loss, single_loss, rtol=1e-5)
    for single, mirrored in zip(single_weights, mirrored_weights):
        np.testing.assert_allclose(mirrored, single, atol=1e-5)


def test_strategy_and_precision_names():
    assert training.make_strategy("none").num_replicas_in_sync == 1
    # This process has two logical CPUs on the same cores: "auto" mirrors over them only when asked for replicas.
    assert training.make_strategy("auto").num_replicas_in_sync == 1
    assert training.make_strategy("auto", cpu_replicas=2).num_replicas_in_sync == 2
    assert training.make_strategy("mirrored").num_replicas_in_sync == 2
    with pytest.raises(ValueError, match="strategy must be one of"):
        training.make_strategy("parameter_server")
    with pytest.raises(ValueError, match="precision must be one of"):
        training.set_precision("float8")
    training.set_precision("mixed_bfloat16")
    assert keras.config.dtype_policy().name == "mixed_bfloat16"


def _compiled_small_model():
    keras.utils.set_random_seed(3)
    model = kt.models.Transformer(**SMALL)
    model.build(((None, None), (None, None)))
    model.compile(optimizer=training.transformer_optimizer(d_model=16), loss=training.MaskedSparseCrossEntropy(0.1))
    return model


def test_optimizer_variables_built_before_fit_train_the_same_weights():
    rng = np.random.default_rng(0)
    sources = rng.integers(1, 30, (8, 6)).astype("int32")
    targets = rng.integers(1, 40, (8, 7)).astype("int32")
    trained = []
    for build_first in (False, True):
        model = _compiled_small_model()
        if build_first:
            training.build_optimizer_variables(model)
            assert len(model.optimizer.variables) > 2 * len(model.trainable_variables)
        model.fit((sources, targets[:, :-1]), targets[:, 1:], batch_size=4, epochs=2, verbose=0, shuffle=False)
        trained.append(model.get_weights())
    for lazily_built, built_first in zip(*trained):
        np.testing.assert_allclose(built_first, lazily_built, rtol=1e-5, atol=1e-6)


def test_accumulating_k_batches_updates_as_one_batch_k_times_larger():
    """`accumulate_steps`: 4 batches of 4 pairs train as 1 batch of 16, and the schedule counts updates."""
    rng = np.random.default_rng(1)
    # No padding: every pair has as many tokens, so the mean of the four
    # batches' mean losses is the big batch's mean over all its tokens.
    sources = rng.integers(4, 30, (32, 6)).astype("int32")
    targets = rng.integers(4, 40, (32, 7)).astype("int32")
    trained = {}
    for accumulate_steps, batch_size in ((1, 16), (4, 4)):
        keras.utils.set_random_seed(3)
        model = kt.models.Transformer(**SMALL)
        model.build(((None, None), (None, None)))
        optimizer = training.transformer_optimizer(d_model=16, warmup_steps=4, accumulate_steps=accumulate_steps)
        model.compile(optimizer=optimizer, loss=training.MaskedSparseCrossEntropy(0.1))
        training.build_optimizer_variables(model)
        model.fit((sources, targets[:, :-1]), targets[:, 1:], batch_size=batch_size, epochs=1, verbose=0,
                  shuffle=False)
        # Paths without the model's own name, which differs between the two.
        weights = {
            variable.path.split("/", 1)[1]: keras.ops.convert_to_numpy(variable) for variable in model.trainable_variables
        }
        trained[accumulate_steps] = (weights, optimizer)
    (one_batch, one_optimizer), (accumulated, accumulating_optimizer) = trained[1], trained[4]
    assert_same_weights(accumulated, one_batch, rtol=1e-4, atol=2e-6)
    initial = _compiled_small_model().get_weights()
    assert not all(np.allclose(weight, start) for weight, start in zip(accumulated.values(), initial)), "no update"
    # Two updates each; the learning rate is the schedule's at update 2, not batch 8.
    assert int(accumulating_optimizer.iterations) == int(one_optimizer.iterations) == 2
    np.testing.assert_allclose(
        float(accumulating_optimizer.learning_rate), float(one_optimizer.learning_rate), rtol=1e-6
    )
    with pytest.raises(ValueError, match="accumulate_steps must be a positive integer"):
        training.transformer_optimizer(d_model=16, accumulate_steps=0)


def test_optimizer_variables_need_a_built_compiled_model():
    with pytest.raises(ValueError, match="needs a built model"):
        training.build_optimizer_variables(kt.models.Transformer(**SMALL))
    model = kt.models.Transformer(**SMALL)
    model.build(((None, None), (None, None)))
    with pytest.raises(ValueError, match="needs a compiled model"):
        training.build_optimizer_variables(model)


def test_weight_decay_shrinks_weight_matrices_but_not_biases_or_norms():
    model = kt.models.TransformerClassifier(
        vocab_size=50, num_classes=2, max_length=10, num_layers=1, d_model=16, num_heads=2, d_ff=32
    )
    model.build((None, None))
    optimizer = training.transformer_optimizer(d_model=16, warmup_steps=10, weight_decay=0.1)
    before = {variable.path: variable.numpy().copy() for variable in model.trainable_variables}
    shrink = 1.0 - float(optimizer.learning_rate) * 0.1  # the first step's learning rate
    # A zero gradient: Adam moves nothing, so every change is the decay.
    optimizer.apply_gradients([(tf.zeros_like(variable), variable) for variable in model.trainable_variables])
    for variable in model.trainable_variables:
        kept = any(part in variable.path for part in ("bias", "gamma", "beta"))
        expected = before[variable.path] * (1.0 if kept else shrink)
        np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-6, err_msg=variable.path)
    with pytest.raises(ValueError, match="weight_decay must be a non-negative number"):
        training.transformer_optimizer(d_model=16, weight_decay=-0.1)


def _ema_run(callbacks, epochs=2, seed=3, initial_epoch=0):
    """A small classifier trained with a weight-averaging optimizer; raw weights recorded after each step."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    model.compile(
        optimizer=training.transformer_optimizer(d_model=16, warmup_steps=4, ema_momentum=0.7),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    features = rng.normal(size=(40, 4)).astype("float32")
    labels = (features[:, 0] > 0).astype("int32")
    steps, epoch_ends = [], []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append([weight.copy() for weight in model.get_weights()])

        def on_epoch_end(self, epoch, logs=None):
            epoch_ends.append([weight.copy() for weight in model.get_weights()])

    history = model.fit(
        features, labels, batch_size=8, epochs=epochs, initial_epoch=initial_epoch, shuffle=False, verbose=0,
        validation_data=(features[:16], labels[:16]), callbacks=[*callbacks, Record()],
    )
    return model, steps, epoch_ends, history, (features[:16], labels[:16])


def test_averaged_weights_are_what_validation_checkpoints_and_the_end_see():
    model, steps, epoch_ends, history, validation = _ema_run([training.AveragedWeights()])
    # The moving average, step by step: the first step's weights, then 0.7 old + 0.3 new.
    average = steps[0]
    for index, weights in enumerate(steps[1:], start=2):
        average = [0.7 * mean + 0.3 * weight for mean, weight in zip(average, weights)]
        if index % 5 == 0:  # 5 steps an epoch: callbacks after AveragedWeights see the average
            for seen, expected in zip(epoch_ends[index // 5 - 1], average):
                np.testing.assert_allclose(seen, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(epoch_ends[-1][0], steps[-1][0])  # the average is not the last step
    for kept, expected in zip(model.get_weights(), average):
        np.testing.assert_allclose(kept, expected, rtol=1e-5, atol=1e-6)
    # Validation was computed with the averaged weights the model now holds.
    np.testing.assert_allclose(history.history["val_loss"][-1], model.evaluate(*validation, verbose=0), rtol=1e-5)
    # Training itself went on from the trained weights, exactly as without the swaps.
    _, plain_steps, _, _, _ = _ema_run([])
    for swapped, plain in zip(steps, plain_steps):
        for a, b in zip(swapped, plain):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_averaged_weights_resume_exactly_after_a_kill(tmp_path):
    expected, _, _, _, _ = _ema_run([training.AveragedWeights()], epochs=3)

    class Killed(Exception):
        pass

    class KillInSecondEpoch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.model.optimizer.iterations.numpy() == 7:
                raise Killed()

    backup = str(tmp_path / "backup")
    with pytest.raises(Killed):
        _ema_run([training.AveragedWeights(), keras.callbacks.BackupAndRestore(backup), KillInSecondEpoch()], epochs=3)
    # A fresh process would build a fresh model: the backup (written at the end of
    # epoch 1, with the average in the model) restores it and training goes on.
    resumed, _, _, _, _ = _ema_run([training.AveragedWeights(), keras.callbacks.BackupAndRestore(backup)], epochs=3, seed=99)
    for got, want in zip(resumed.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="ema_momentum must be between 0 and 1"):
        training.transformer_optimizer(d_model=16, ema_momentum=1.0)


def test_averaged_weights_leave_a_fit_started_at_a_later_epoch_alone():
    # No backup was restored: the model holds its own weights, nothing to swap back.
    _, steps, _, _, _ = _ema_run([training.AveragedWeights()], epochs=3, initial_epoch=1)
    _, plain_steps, _, _, _ = _ema_run([], epochs=3, initial_epoch=1)
    for swapped, plain in zip(steps, plain_steps):
        for a, b in zip(swapped, plain):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("signalled_after_batch, stopped_at", [(1, (0, 2)), (4, (1, 0))])
def test_sigterm_saves_after_the_step_under_way_or_at_the_epochs_end(tmp_path, signalled_after_batch, stopped_at):
    # 5 steps an epoch. SIGTERM in the middle: the backup holds the batches done. SIGTERM
    # in the epoch's last step: the epoch ends first (validation, history), and the backup
    # is that of its end, never a mid-epoch one with nothing left to train.
    import os
    import signal

    class Preempted(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if self.params and batch == signalled_after_batch and not getattr(self, "sent", False):
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)

    backup = training.TrainingBackup(str(tmp_path / "backup"))
    handler_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(training.TrainingInterrupted, match="stopped by SIGTERM"):
        _ema_run([Preempted(), backup], epochs=3)
    state = training.read_backup(str(tmp_path / "backup"))
    assert (state.epoch, state.batches_done) == stopped_at
    assert signal.getsignal(signal.SIGTERM) == handler_before, "the SIGTERM handler was left installed"
    assert [name for name in os.listdir(tmp_path / "backup") if name.endswith(".h5")] == [state.weights]


def test_a_backup_save_cut_short_by_a_kill_leaves_nothing_once_training_goes_on(tmp_path):
    # Processes killed (SIGKILL) in the middle of writing a backup's weights and its state
    # leave their hidden staging files; the next save of the resumed run takes them away,
    # and only them: a file staged after training began is a live save's.
    import os
    import signal

    from keras_transformer import saving

    backup_dir = tmp_path / "backup"
    _ema_run([training.TrainingBackup(str(backup_dir))], epochs=1)

    def write_half_then_die(path):
        with open(path, "wb") as half:
            half.write(b"half a file")
        os.kill(os.getpid(), signal.SIGKILL)

    for name in ("epoch-00001-batch-0000003.weights.h5", "state.json"):
        child = os.fork()
        if child == 0:  # the killed process
            signal.alarm(30)  # ends a child that hangs, and the test with it
            saving.replace_whole(str(backup_dir / name), write_half_then_die)
            os._exit(0)  # never reached
        _, status = os.waitpid(child, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left_by_kills = sorted(name for name in os.listdir(backup_dir) if name.startswith(".incomplete-"))
    assert sorted(name.rsplit(".", 1)[-1] for name in left_by_kills) == ["h5", "json"]

    class SaveUnderWay(keras.callbacks.Callback):  # another writer's staging file, after training began
        def on_train_begin(self, logs=None):
            (backup_dir / ".incomplete-live.weights.h5").write_bytes(b"being written")

    _ema_run([training.TrainingBackup(str(backup_dir)), SaveUnderWay()], epochs=2)
    state = training.read_backup(str(backup_dir))
    assert state.epoch == 2
    assert sorted(os.listdir(backup_dir)) == sorted([".incomplete-live.weights.h5", state.weights, "state.json"])
