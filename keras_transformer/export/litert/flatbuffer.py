"""Reading and rewriting a converted LiteRT file (its flatbuffer): the operator table, shapes, int8 tables.

The converter's output is correct but leaves speed and size on the table:
`top_k_sized_when_prepared` lets a beam search's loop hand its state on
uncopied, `one_copy_of_each_table` stores a tied embedding once and
`int8_lookups` looks its rows up in int8. `check_operators` refuses a file
that the mobile runtime could not run.
"""

import collections

# The tensorflow-text kernels `tensorflow_text.tflite_registrar` registers with LiteRT, by operator name.
TEXT_OPERATORS = frozenset({
    "FastWordpieceTokenizeWithOffsets", "TFText>FastWordpieceDetokenize", "FastBertNormalize",
    "TFText>FastSentencepieceTokenize", "TFText>FastSentencepieceDetokenize", "TFText>NgramsStringJoin",
    "TFText>ByteSplitWithOffsets", "TFText>ByteSplitByOffsets", "RaggedTensorToTensor", "TFText>Utf8Binarize",
    "TFText>WhitespaceTokenize",
})


def top_k_sized_when_prepared(model):
    """The file (bytes) with no unknown size left in a `TOPK_V2` input's shape signature.

    The converter marks the batch axis unknown (-1) in the shape signature
    of every tensor it flows through. LiteRT's `TOPK_V2` reads that mark as
    "this input's size may change at any run" and sizes its outputs at every
    run, not once when its graph is prepared; and a loop (`WHILE`) whose
    body holds one tensor sized at run time copies its whole state in and
    out at every step, where otherwise it copies only what the step
    changed. Beam search keeps its batch within a chunk of steps
    (`inference.loops.Chunks`): its top-k's sizes are known whenever its
    loop is prepared, and LiteRT prepares a loop's body again whenever the
    shapes it starts with change (and the operators after one whose output
    is sized at run time, once it has run), so the outputs are always sized
    from the input's actual shape. Nothing else reads the signature of a
    tensor inside a graph (a graph's own inputs, whose signatures say what a
    caller may resize, are left as they are).

    Each unknown size is overwritten in place with the size the converter
    wrote into the tensor's shape: the file is not rebuilt, so its weights
    keep the converter's alignment.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = bytearray(model)  # the signatures' numbers are written in place
    root = schema.Model.GetRootAs(model, 0)
    top_k = {index for index in range(root.OperatorCodesLength())
             if max(root.OperatorCodes(index).BuiltinCode(), root.OperatorCodes(index).DeprecatedBuiltinCode())
             == schema.BuiltinOperator.TOPK_V2}
    for subgraph in (root.Subgraphs(index) for index in range(root.SubgraphsLength())):
        graph_inputs = set(subgraph.InputsAsNumpy().tolist()) if not subgraph.InputsIsNone() else set()
        for operator in (subgraph.Operators(index) for index in range(subgraph.OperatorsLength())):
            if operator.OpcodeIndex() not in top_k or operator.Inputs(0) in graph_inputs:
                continue
            tensor = subgraph.Tensors(operator.Inputs(0))
            if not tensor.ShapeSignatureIsNone():
                signature = tensor.ShapeSignatureAsNumpy()  # a view into `model`
                signature[signature == -1] = tensor.ShapeAsNumpy()[signature == -1]
    return bytes(model)


def one_copy_of_each_table(model):
    """The int8 file (bytes) with a tied embedding table stored once, row by row.

    With tied embeddings one table is both looked up (the embeddings) and
    multiplied by (the output projection), and dynamic-range quantization
    makes two int8 copies of it: one with a single scale for the whole
    table, which a `DEQUANTIZE` turns back into floats for the lookups, and
    one with a scale per row for the projection. Here each such `DEQUANTIZE`
    reads the per-row copy instead, where one holds the same weight (equal
    to within one step of the coarser copy's scale, everywhere) and the
    `DEQUANTIZE` is the only reader of its own, and the other copy goes: a
    quarter smaller file at OPUS-MT-base's size, and lookups quantized row by
    row, more finely than before. A table read by an int8 `GATHER` instead
    (looked up in the decoding loop alone: a target vocabulary of its own)
    keeps both copies: a gather's output carries the one scale of its
    input, so it cannot read the per-row copy. A file whose weights lie
    outside its flatbuffer (over 2 GB) is returned as it is.
    """
    import copy

    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    flatbuffer = schema.ModelT.InitFromObj(schema.Model.GetRootAs(model, 0))
    buffers = flatbuffer.buffers
    if any(buffer.offset > 1 for buffer in buffers):
        return model

    def scales(tensor):
        quantization = tensor.quantization
        has_data = buffers[tensor.buffer].data is not None and len(buffers[tensor.buffer].data) > 0
        if tensor.type != schema.TensorType.INT8 or quantization is None or quantization.scale is None or not has_data:
            return None
        return np.asarray(quantization.scale, np.float32)

    def dequantized(tensor):
        values = np.frombuffer(bytes(buffers[tensor.buffer].data), np.int8).reshape(tensor.shape)
        return values * scales(tensor).reshape([-1] + [1] * (values.ndim - 1))  # one scale, or one a row

    per_row = [tensor for subgraph in flatbuffer.subgraphs for tensor in subgraph.tensors
               if scales(tensor) is not None and scales(tensor).size > 1 and tensor.quantization.quantizedDimension == 0]
    dequantize = [index for index, code in enumerate(flatbuffer.operatorCodes)
                  if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE]
    for subgraph in flatbuffer.subgraphs:
        readers = collections.Counter(int(index) for operator in subgraph.operators for index in operator.inputs)
        readers.update(int(index) for index in (subgraph.outputs if subgraph.outputs is not None else []))
        for operator in subgraph.operators:
            table = subgraph.tensors[operator.inputs[0]]
            if (operator.opcodeIndex not in dequantize or readers[int(operator.inputs[0])] != 1
                    or scales(table) is None or scales(table).size != 1):
                continue
            for twin in (twin for twin in per_row if list(twin.shape) == list(table.shape)):
                if np.abs(dequantized(twin) - dequantized(table)).max() <= scales(table)[0] * (1 + 1e-4):
                    table.buffer, table.quantization = twin.buffer, copy.deepcopy(twin.quantization)
                    # A DEQUANTIZE of per-channel input is the operator's version 5 (LiteRT's op_version).
                    code = flatbuffer.operatorCodes[operator.opcodeIndex]
                    code.version = max(code.version, 5)
                    break
    # The buffers still in use: the tensors', and the converter's metadata (its runtime version, its options).
    pointed_at = {tensor.buffer for subgraph in flatbuffer.subgraphs for tensor in subgraph.tensors}
    pointed_at.update(entry.buffer for entry in flatbuffer.metadata or [])
    pointed_at.update(int(number) for number in (flatbuffer.metadataBuffer if flatbuffer.metadataBuffer is not None else []))
    for number, buffer in enumerate(buffers):
        if number not in pointed_at:
            buffer.data = None
    return _packed(flatbuffer)


def int8_lookups(model):
    """The int8 file (bytes) with each table's lookups reading int8 rows, not the whole table turned into floats.

    A tied table's lookups read its per-row int8 copy through a `DEQUANTIZE`
    of the whole table (`one_copy_of_each_table`): LiteRT computes that once
    and keeps it, a float32 table as large as four int8 ones (112 MB at
    OPUS-MT-base's size), and the decoder's lookups, inside the search's
    loops, take it in as a loop operand: each `WHILE` copies it into its
    body and out again, and holds those copies too. Here each lookup
    gathers the int8 rows it needs and scales them by their rows' scales
    (`GATHER`, `DEQUANTIZE` with a scale of 1, `GATHER` of the scales,
    `MUL`: the same floats, `q * scale`, as the whole table's), the loops
    no longer carry the table, and its `DEQUANTIZE` goes. A table that
    anything but a plain lookup or a loop that passes it on reads is left
    as it is, as is a file whose weights lie outside its flatbuffer.
    """
    editable = _EditableModel.of(model)
    if editable is None:
        return model
    changed = False
    for graph, subgraph in enumerate(editable.subgraphs):
        for dequantize in [operator for operator in subgraph.operators
                           if editable.kind(operator) == editable.builtin.DEQUANTIZE]:
            changed |= _lookups_in_int8(editable, graph, dequantize)
    return editable.packed() if changed else model


class _EditableModel:
    """A LiteRT file unpacked for editing (the flatbuffer's object API): its operators, tensors and loops."""

    def __init__(self, flatbuffer):
        from ai_edge_litert import schema_py_generated as schema

        self.schema, self.builtin = schema, schema.BuiltinOperator
        self.flatbuffer, self.codes, self.subgraphs = flatbuffer, flatbuffer.operatorCodes, flatbuffer.subgraphs
        # How many operators run each subgraph: a loop body that two operators share is left alone.
        self.runs = collections.Counter(
            getattr(operator.builtinOptions, name) for subgraph in self.subgraphs for operator in subgraph.operators
            for name in ("condSubgraphIndex", "bodySubgraphIndex", "thenSubgraphIndex", "elseSubgraphIndex")
            if hasattr(operator.builtinOptions, name))

    @classmethod
    def of(cls, model):
        """`model` (bytes) unpacked, or None when its weights lie outside its flatbuffer (over 2 GB)."""
        from ai_edge_litert import schema_py_generated as schema

        flatbuffer = schema.ModelT.InitFromObj(schema.Model.GetRootAs(model, 0))
        return None if any(buffer.offset > 1 for buffer in flatbuffer.buffers) else cls(flatbuffer)

    def packed(self):
        """The file (bytes) as edited."""
        return _packed(self.flatbuffer)

    def kind(self, operator):
        code = self.codes[operator.opcodeIndex]
        return max(code.builtinCode, code.deprecatedBuiltinCode)

    def opcode(self, operator_kind, version):
        """The index of a code of `operator_kind` at `version` or above (LiteRT's op_version), added if none is."""
        for index, code in enumerate(self.codes):
            if max(code.builtinCode, code.deprecatedBuiltinCode) == operator_kind and code.version >= version:
                return index
        code = self.schema.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.version = operator_kind, min(operator_kind, 127), version
        self.codes.append(code)
        return len(self.codes) - 1

    @staticmethod
    def readers(subgraph, tensor):
        return [operator for operator in subgraph.operators if tensor in list(operator.inputs)]

    def add_buffer(self, values):
        """A new buffer holding `values` (a NumPy array): its number."""
        import numpy as np

        buffer = self.schema.BufferT()
        buffer.data = np.frombuffer(values.tobytes(), np.uint8)
        self.flatbuffer.buffers.append(buffer)
        return len(self.flatbuffer.buffers) - 1

    def add_tensor(self, subgraph, name, tensor_type, shape, signature=None, buffer=0, unit_scale=False):
        import numpy as np

        tensor = self.schema.TensorT()
        tensor.name, tensor.type, tensor.buffer = name, tensor_type, buffer
        tensor.shape = np.asarray(shape, np.int32)
        tensor.shapeSignature = None if signature is None else np.asarray(signature, np.int32)
        if unit_scale:  # int8 read as the integers they are: (q - 0) * 1
            tensor.quantization = self.schema.QuantizationParametersT()
            tensor.quantization.scale, tensor.quantization.zeroPoint = [1.0], [0]
        subgraph.tensors.append(tensor)
        return len(subgraph.tensors) - 1

    def add_operator(self, operator_kind, inputs, outputs, like=None, version=1):
        """A new operator: `like`'s options (and its code, unless it needs a higher `version`)."""
        import copy

        operator = self.schema.OperatorT()
        if like is not None:
            version = max(version, self.codes[like.opcodeIndex].version)
        operator.opcodeIndex = self.opcode(operator_kind, version)
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        if like is not None:
            operator.builtinOptionsType, operator.builtinOptions = like.builtinOptionsType, copy.deepcopy(
                like.builtinOptions)
        elif operator_kind == self.builtin.MUL:
            operator.builtinOptionsType = self.schema.BuiltinOptions.MulOptions
            operator.builtinOptions = self.schema.MulOptionsT()
        return operator


def _packed(flatbuffer):
    """A flatbuffer's object (`ModelT`) written back as a LiteRT file (bytes)."""
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(flatbuffer.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _lookups_in_int8(editable, graph, dequantize):
    """Have the lookups of the table `dequantize` turns into floats read its int8 rows; whether it could."""
    import numpy as np

    schema, subgraphs = editable.schema, editable.subgraphs
    subgraph = subgraphs[graph]
    table = subgraph.tensors[dequantize.inputs[0]]
    scales = table.quantization.scale if table.quantization is not None else None
    if (table.type != schema.TensorType.INT8 or len(table.shape) != 2 or scales is None
            or len(scales) != table.shape[0] or table.quantization.quantizedDimension != 0
            or any(table.quantization.zeroPoint)):
        return False
    lookups, loops = [], []
    if not _only_looked_up(editable, graph, dequantize.outputs[0], lookups, loops) or not lookups:
        return False
    scales_buffer = editable.add_buffer(np.asarray(scales, np.float32))
    for lookup_graph, lookup in lookups:
        _look_up_int8_rows(editable, subgraphs[lookup_graph], lookup, table, scales_buffer)
    # Inner loops first: an outer loop's operand numbers stay as they were until its turn.
    for loop, operand in reversed(loops):
        options = loop.builtinOptions
        body, cond = subgraphs[options.bodySubgraphIndex], subgraphs[options.condSubgraphIndex]
        for holder, field in ((loop, "inputs"), (loop, "outputs"), (body, "inputs"), (body, "outputs"),
                              (cond, "inputs")):
            setattr(holder, field, [value for number, value in enumerate(getattr(holder, field)) if number != operand])
    subgraph.operators.remove(dequantize)
    return True


def _only_looked_up(editable, graph, tensor, lookups, loops, passed_on_as=None):
    """Whether `tensor` (a table in subgraph `graph`) is read only by lookups, and by loops that pass it on
    untouched to bodies where the same holds; gathers `(graph, GATHER)` into `lookups` and `(WHILE, operand)`
    into `loops`, outer loops first. `passed_on_as`: in a loop's body, the output that hands it on."""
    subgraphs, builtin, runs = editable.subgraphs, editable.builtin, editable.runs
    subgraph = subgraphs[graph]
    outputs = list(subgraph.outputs if subgraph.outputs is not None else [])
    if [number for number, output in enumerate(outputs) if output == tensor] not in ([], [passed_on_as]):
        return False
    for operator in editable.readers(subgraph, tensor):
        inputs, options = list(operator.inputs), operator.builtinOptions
        if (editable.kind(operator) == builtin.GATHER and inputs.index(tensor) == 0 and inputs.count(tensor) == 1
                and options.axis == 0 and options.batchDims == 0):
            lookups.append((graph, operator))
            continue
        if editable.kind(operator) != builtin.WHILE or inputs.count(tensor) != 1:
            return False
        operand = inputs.index(tensor)
        cond, body = subgraphs[options.condSubgraphIndex], subgraphs[options.bodySubgraphIndex]
        passed_on = body.inputs[operand]
        if (runs[options.condSubgraphIndex] != 1 or runs[options.bodySubgraphIndex] != 1
                or body.outputs[operand] != passed_on or editable.readers(cond, cond.inputs[operand])
                or editable.readers(subgraph, operator.outputs[operand]) or operator.outputs[operand] in outputs):
            return False
        loops.append((operator, operand))
        if not _only_looked_up(editable, options.bodySubgraphIndex, passed_on, lookups, loops, passed_on_as=operand):
            return False
    return True


def _look_up_int8_rows(editable, owner, lookup, table, scales_buffer):
    """Replace `lookup` (a GATHER of the floats of `table`) in subgraph `owner` by int8 rows times their scales."""
    schema, builtin = editable.schema, editable.builtin
    ids, rows = lookup.inputs[1], owner.tensors[lookup.outputs[0]]
    name = rows.name.decode() if isinstance(rows.name, bytes) else rows.name
    shape, signature = list(rows.shape), rows.shapeSignature
    one_per_row = (shape[:-1] + [1], None if signature is None else list(signature)[:-1] + [1])
    int8_table = editable.add_tensor(owner, name + "/int8_table", schema.TensorType.INT8, table.shape,
                                     buffer=table.buffer, unit_scale=True)
    scale_table = editable.add_tensor(owner, name + "/row_scales", schema.TensorType.FLOAT32, [table.shape[0], 1],
                                      buffer=scales_buffer)
    int8_rows = editable.add_tensor(owner, name + "/int8_rows", schema.TensorType.INT8, shape, signature,
                                    unit_scale=True)
    unscaled = editable.add_tensor(owner, name + "/unscaled", schema.TensorType.FLOAT32, shape, signature)
    row_scales = editable.add_tensor(owner, name + "/scales", schema.TensorType.FLOAT32, *one_per_row)
    position = owner.operators.index(lookup)
    owner.operators[position:position + 1] = [
        # An int8 GATHER and an int8 DEQUANTIZE are their operators' version 2 (LiteRT's op_version).
        editable.add_operator(builtin.GATHER, [int8_table, ids], [int8_rows], like=lookup, version=2),
        editable.add_operator(builtin.DEQUANTIZE, [int8_rows], [unscaled], version=2),
        editable.add_operator(builtin.GATHER, [scale_table, ids], [row_scales], like=lookup),
        editable.add_operator(builtin.MUL, [unscaled, row_scales], lookup.outputs),
    ]


def operators(model):
    """The names of the operators a LiteRT file (bytes) uses: builtin ones by their enum name, custom ones by theirs."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    flatbuffer = schema.Model.GetRootAsModel(model, 0)
    found = set()
    for index in range(flatbuffer.OperatorCodesLength()):
        code = flatbuffer.OperatorCodes(index)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        found.add(code.CustomCode().decode() if builtin == schema.BuiltinOperator.CUSTOM else names[builtin])
    return sorted(found)


def check_operators(model, allowed=TEXT_OPERATORS):
    """A ValueError naming every operator of `model` that is neither builtin nor one of `allowed` (custom ones)."""
    from ai_edge_litert import schema_py_generated as schema

    builtin = set(vars(schema.BuiltinOperator))
    foreign = [name for name in operators(model) if name not in builtin and name not in allowed]
    if foreign:
        runtime = "the mobile runtime" if allowed else "stock LiteRT (builtin operators only)"
        raise ValueError(f"the LiteRT file would need operators {runtime} lacks: {', '.join(foreign)}")
