"""`model.fit` across machines: what Keras 3 needs to train under `MultiWorkerMirroredStrategy`.

Keras 3's TensorFlow trainer fails there (keras-team/keras#20585), for two
reasons found by running it with two worker processes:

1. Before the first step, `fit` builds the model's metrics from one batch
   (`_maybe_symbolic_build`). It gets that batch from the distributed
   iterator as per-replica values and asks the strategy to average them,
   only to read their shapes. Averaging token ids makes no sense, and across
   workers the strategy's collective reduce does not take a nested
   structure at all: "Attempt to convert a value (PerReplica:{...}) ... to a
   Tensor". (On one machine it fails too, when the replicas' shares of a
   short last batch differ in size.)
2. After every step, the loss and metric values of all replicas are
   averaged with `strategy.reduce("MEAN", value, axis=0)` when the strategy
   spans several workers: "along the batch axis, then across replicas". The
   values are scalars, which have no axis 0: "Invalid reduction dimension 0
   for input with 0 dimensions".

`MultiWorkerFit` fixes both from inside the model, with no change to Keras
and nothing asked of the user: the shapes are read from this worker's first
replica's batch, and inside a multi-worker step the metric values are
handed over as vectors of one element, which the same reduce averages over
every replica of every worker (the value a single machine reports). The
metrics' own variables are summed across replicas, so the epoch's logs and
`History` are those of the whole global batch.

Mix it into a `keras.Model` subclass before the Keras base class:

    class MyModel(MultiWorkerFit, keras.Model): ...

`Transformer` and `TransformerClassifier` do. `tf.distribute` is TensorFlow's:
on the JAX and PyTorch backends the mixin changes nothing and TensorFlow is
never imported.
"""

import keras


def _on_tensorflow():
    return keras.backend.backend() == "tensorflow"


def spans_workers(strategy):
    """Whether `strategy` is a MultiWorkerMirroredStrategy over more than one worker."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    tasks = strategy.cluster_resolver.cluster_spec().as_dict().values()
    return sum(len(addresses) for addresses in tasks) > 1


class MultiWorkerFit:
    """Mixin for `keras.Model` subclasses: `fit`, `evaluate` and validation under `MultiWorkerMirroredStrategy`."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras reads a batch only for its shapes and dtypes, by averaging the
        # replicas' shares: a collective op across workers, and an error when
        # the shares differ (a last batch of 17 rows over two replicas). This
        # worker's first replica's share has the shapes and dtypes, with neither.
        if (
            _on_tensorflow()
            and iterator is not None
            and data_batch is None
            and self._distribute_strategy is not None
        ):
            for _, _, batches in iterator:
                data_batch = keras.tree.map_structure(self._first_replica, next(batches))
                break
            iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _first_replica(self, value):
        import tensorflow as tf

        if isinstance(value, tf.distribute.DistributedValues):
            return self.distribute_strategy.experimental_local_results(value)[0]
        return value

    def get_metrics_result(self):
        results = super().get_metrics_result()
        if not _on_tensorflow():
            return results
        import tensorflow as tf

        if not tf.distribute.in_cross_replica_context() and spans_workers(tf.distribute.get_strategy()):
            # Inside a step: a vector of one element, for Keras' reduce along axis 0.
            results = {name: tf.reshape(value, [1]) for name, value in results.items()}
        return results
