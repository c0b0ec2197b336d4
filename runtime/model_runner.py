"""The session side of the engine: one engine-graph session with the KV pool and adapter stacks bound once.

SessionManager duties for one artifact: verify (done by load_artifact), register the ops library, set
threads, allocate the block pool and adapter slots as OrtValues, bind them through IO binding (cache
outputs bound to the very OrtValues of the cache inputs, so PagedAttention writes the pool in place and
nothing is copied per step), warm up (a prefill and a decode), then serve `execute(seqs)` per step.
"""
from __future__ import annotations

import functools
import itertools
import os
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from . import contract as C
from .artifact import Artifact, ArtifactError
from .config import EngineConfig
from .errors import ConfigError
from .lora_stacks import quantize_a, quantize_b
from .memory_plan import kv_pool_size
from .ops_library import register_ops
from .scheduler_messages import ScheduledSeq

PACKED = ("a", "a_scale", "b", "b_scale")      # an int8 stack's arrays per adapted projection, in write order
_KV_NUMPY = C.KV_STORAGE


@dataclass(frozen=True)
class KVPoolLayout:
    """The paged KV pool a session holds (what memory reports and direct-step callers size against)."""
    kv: str                     # the artifact's KV dtype name ("fp32", "int8", "fp8")
    block_size: int             # tokens per block
    num_blocks: int             # blocks in the pool, the null block 0 included
    bytes_per_block: int        # over all layers: K and V, plus the 8-bit caches' scales

    @property
    def pool_bytes(self) -> int:
        return self.bytes_per_block * self.num_blocks

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size


def logits_rows(seqs: list[ScheduledSeq], starts: list[int] | None = None) -> np.ndarray:
    """[R] int64 rows of the flattened batch that get logits: for each seq with needs_logits its last row,
    and with k drafts its last k + 1 rows (the last verified token's and each draft's). starts: each seq's first
    row in the flattened batch (by_adapter's order; None: the seqs' own order)."""
    rows, end = [], 0
    for i, s in enumerate(seqs):
        end = (end if starts is None else starts[i]) + s.num_tokens
        if s.needs_logits:
            rows.extend(range(end - 1 - len(s.spec_token_ids), end))
    return np.asarray(rows, dtype=np.int64)


def hidden_rows(seqs: list[ScheduledSeq], starts: list[int] | None = None) -> list[int]:
    """Rows of the flattened batch whose final hidden state the step returns: each seq's last hidden_rows rows
    (embedding requests), in order; none in generation steps. starts: as logits_rows'."""
    rows, end = [], 0
    for i, s in enumerate(seqs):
        end = (end if starts is None else starts[i]) + s.num_tokens
        if s.hidden_rows:
            rows.extend(range(end - s.hidden_rows, end))
    return rows


def by_adapter(seq_slots: list[int]) -> list[int] | None:
    """The order a step's seqs are fed in: stably sorted by adapter slot (base rows, -1, first), so that each
    adapter's rows are one run of the flattened batch and a QLinear token tile holds one adapter. None when the
    seqs are in that order already (a base-only step, one adapter). Each row's values do not depend on where it sits
    in the batch (qlinear.h): the order changes no bits. The ops group each call's tokens by slot themselves
    (QLinear's plan_lora, MultiLoRA's counting sort), so no kernel needs this order today: it was the ground for
    a LoRA expand inside the projection's tiles, which measured slower (docs/notes/adapters.md, Overhead)."""
    if all(a <= b for a, b in zip(seq_slots, seq_slots[1:])):
        return None
    return sorted(range(len(seq_slots)), key=seq_slots.__getitem__)


def seq_terms(spec, slots: dict[str | None, int]) -> list[tuple[int, float]]:
    """A seq's AdapterSpec (sampling_params: None, a name, or ((name, weight), ...)) as its (slot, weight) terms in
    the spec's order, the order the ops add them in; adapters without a slot here (none given) are left out."""
    if spec is None:
        return []
    if isinstance(spec, str):
        return [(slots[spec], 1.0)] if spec in slots else []
    return [(slots[name], w) for name, w in spec if name in slots]


def adapter_rows(terms: list[list[tuple[int, float]]]) -> tuple[list[list[int]], list[list[float]]]:
    """Per seq, its token_adapter and token_adapter_weight rows [M] (M: the most terms of any seq, at least 1),
    -1 and weight 0 after its terms."""
    m = max(1, max(map(len, terms), default=1))
    return ([[s for s, _ in t] + [-1] * (m - len(t)) for t in terms],
            [[w for _, w in t] + [0.0] * (m - len(t)) for t in terms])


def fed_starts(seqs: list[ScheduledSeq], order: list[int]) -> list[int]:
    """[S] each seq's first row in the batch fed in `order` (seqs' indices), by the seqs' own index."""
    starts, row = [0] * len(seqs), 0
    for i in order:
        starts[i] = row
        row += seqs[i].num_tokens
    return starts


class ModelRunner:
    def __init__(self, artifact: Artifact, config: EngineConfig):
        if artifact.graph != "engine":
            raise ArtifactError(f"{artifact.path} holds a '{artifact.graph}' graph; the engine runs engine graphs: "
                                f"rebuild with: ortllm build ... --graph engine --out {artifact.path} --force")
        cfg, build = artifact.model_config, artifact.manifest["build"]
        self.vocab_size = cfg["vocab_size"]
        self.num_layers = cfg["num_layers"]
        self.kv = build["kv"]
        self.block_size = build["kv_block_size"]
        want_kv = config.cache.kv_dtype
        if want_kv is not None and want_kv != C.KV_DTYPES[self.kv]:
            raise ConfigError(f"kv_dtype {want_kv} differs from the artifact's ({C.KV_DTYPES[self.kv]}); "
                              f"rebuild with --kv, or leave kv_dtype unset")
        if config.cache.block_size != self.block_size:
            raise ConfigError(f"block_size {config.cache.block_size} differs from the artifact's KV block size "
                              f"({self.block_size}); leave it unset or rebuild with --kv-block-size")
        self.bytes_per_block, self.num_blocks = kv_pool_size(config, artifact)

        so = ort.SessionOptions()
        so.intra_op_num_threads = config.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if os.environ.get("ORTLLM_ORT_PROFILE"):      # ORT's per-node profile (bench/probes/profile_step.py reads it)
            so.enable_profiling = True
            so.profile_file_prefix = os.environ["ORTLLM_ORT_PROFILE"]
        for entry in filter(None, os.environ.get("ORTLLM_ORT_CONFIG", "").split(",")):
            key, _, value = entry.partition("=")      # ORT session config entries to try (bench/probes/ort_settings.py)
            so.add_session_config_entry(key.strip(), value.strip())
        register_ops(so, isa=config.ops_isa)
        self.session = ort.InferenceSession(str(artifact.file(C.MODEL)), so, providers=["CPUExecutionProvider"])
        self.io = self.session.io_binding()
        self.io.bind_output(C.LOGITS, "cpu")          # first bound output: get_outputs()[0], rebound per step
        self._arrays: dict[str, np.ndarray] = {}      # keeps the bound pool / adapter memory alive
        self._logits = np.empty((0, self.vocab_size), np.float32)   # [rows, V] reused by decode steps
        self._inputs: dict[str, np.ndarray] = {}      # the step inputs bound now (memory shared with ORT)
        self._logits_bound: tuple[int, int] | None = None   # (id of the buffers' array, rows) bound now
        self._argmax = np.empty(0, np.int64)          # logits_argmax [R], bound beside the logits, grows with them
        self.argmax: np.ndarray | None = None          # the last execute()'s logits_argmax rows
        self._order: np.ndarray | None = None          # the last execute()'s feed order (by_adapter), None: as given
        self.hidden_size = cfg["hidden_size"]
        self._hidden = np.empty((16, self.hidden_size), np.float32)   # hidden_states [E, H], grows as needed
        self._hidden_bound = -1                        # rows bound now (-1: none yet)
        self.hidden: np.ndarray | None = None          # the last execute()'s hidden_states rows (hidden_rows)
        self.run_time_s = 0.0                          # total time in session.run (the engine's Python share)
        # every run's options: the engine sets .terminate from another thread to end a run whose rows were
        # cancelled (ORT checks it between nodes; the run then raises)
        self.run_options = ort.RunOptions()
        self._bind_pool(cfg)
        # the stacks' shapes by input name: int8 ones of every layer per target (QLinear projections, with their
        # scales) and float16 ones per layer and target (MultiLoRA); a build may have both (`--keep` splits)
        self._lora_shapes = {i.name: i.shape for i in self.session.get_inputs() if i.name.startswith("lora.")}
        self.resize_adapter_slots(1, 1)
        self._warm_up()

    # ---- bound once
    def _bind_pool(self, cfg: dict) -> None:
        """key/value cache [layers, num_blocks, Hkv, block_size, D] (int4: D / 2, two codes a byte; + fp16 scales
        [layers, num_blocks, Hkv, block_size] for the quantized dtypes): one input a kind, and each layer's output
        bound to its slice of the same memory (contract 7)."""
        row = C.kv_row_elems(C.KV_DTYPES[self.kv], cfg["head_dim"])
        shape = (self.num_layers, self.num_blocks, cfg["num_kv_heads"], self.block_size, row)
        for kind in C.cache_kinds(C.kv_scaled(C.KV_DTYPES[self.kv])):
            shp, dtype = (shape, _KV_NUMPY[self.kv]) if kind.endswith("cache") else (shape[:4], np.float16)
            arr = np.full(shp, 0, dtype)   # touched now: RSS shows the pool, no page faults while serving
            self._arrays[C.cache_name(kind)] = arr
            self.io.bind_ortvalue_input(C.cache_name(kind), ort.OrtValue.ortvalue_from_numpy(arr))   # shares arr
            for i in range(self.num_layers):   # arr[i] is contiguous: its OrtValue shares that slice
                self.io.bind_ortvalue_output(C.cache_out_name(kind, i), ort.OrtValue.ortvalue_from_numpy(arr[i]))

    def resize_adapter_slots(self, slots: int, max_rank: int) -> None:
        """(Re)allocate the adapter slot stacks, zero-filled, and bind them; slot contents are lost.

        Per target, for QLinear projections (contract 7), every layer in one stack: A int8 [layers, slots, in, r]
        with A_scale float16 [layers, slots, ceil(in / 32), r], B int8 [layers, slots, r, out] with B_scale float16
        [layers, slots, out] (r = max_rank rounded up to a multiple of 4: B's rank quads); per layer and target for
        MultiLoRA ones (fp32 artifacts): A [slots, in, r], B [slots, r, out] float16. lora.scale [slots] float32; per
        target lora.rank.{target} [slots] int32. DoRA (contract 11): lora.dora [slots] int32 and per target
        lora.{target}.dora_scale [layers, slots, out] float32 (both projection forms).
        """
        self.adapter_slots, self.adapter_rank = slots, max_rank
        r, L = -(-max_rank // 4) * 4, self.num_layers
        self._bind_static(C.LORA_SCALE, np.zeros(slots, np.float32))
        if C.LORA_DORA in self._lora_shapes:
            self._bind_static(C.LORA_DORA, np.zeros(slots, np.int32))
        for target in C.LORA_TARGETS:
            self._bind_static(C.lora_rank_name(target), np.zeros(slots, np.int32))
            stack = functools.partial(C.lora_stack_name, target)
            if stack("dora_scale") in self._lora_shapes:
                n = self._lora_shapes[stack("dora_scale")][2]
                self._bind_static(stack("dora_scale"), np.ones((L, slots, n), np.float32))
            if stack("a") in self._lora_shapes:
                k, n = self._lora_shapes[stack("a")][2], self._lora_shapes[stack("b")][3]
                self._bind_static(stack("a"), np.zeros((L, slots, k, r), np.int8))
                self._bind_static(stack("a_scale"), np.zeros((L, slots, -(-k // C.LORA_CHUNK), r), np.float16))
                self._bind_static(stack("b"), np.zeros((L, slots, r, n), np.int8))
                self._bind_static(stack("b_scale"), np.zeros((L, slots, n), np.float16))
            for i in range(L):
                a, b = C.lora_name(i, target, "a"), C.lora_name(i, target, "b")
                if a in self._lora_shapes:
                    k, n = self._lora_shapes[a][1], self._lora_shapes[b][2]
                    self._bind_static(a, np.zeros((slots, k, r), np.float16))
                    self._bind_static(b, np.zeros((slots, r, n), np.float16))

    def write_adapter_slot(self, slot: int, tensors: dict[str, np.ndarray], rank: int, scale: float) -> None:
        """Copy one adapter (layers.{i}.{target}.a [in, r] / .b [r, out], float32 as stored) into `slot` of the
        bound stacks, packed at the start of the slot so a rank below the stack's streams only its own bytes:
        int8 stacks (at [layer, slot]) get lora_stacks' codes and scales (QLinear's layouts); float16 ones .a
        row-major [in, r] (MultiLoRA packed_a) and .b in its first r rows (numpy rounds to nearest on assignment).
        Targets it does not adapt are zeroed and get rank 0, so the ops skip the slot there. A DoRA adapter's
        layers.{i}.{target}.g [out] go to the dora_scale stacks and flag the slot in lora.dora. Writes the bound
        memory in place: no rebinding."""
        adapted, dora = set(), any(k.endswith(".g") for k in tensors)
        for i in range(self.num_layers):
            for target in C.LORA_TARGETS:
                key, stack, name = (f"layers.{i}.{target}", functools.partial(C.lora_stack_name, target),
                                    functools.partial(C.lora_name, i, target))
                int8 = [self._arrays[stack(w)][i, slot] for w in PACKED
                        if stack(w) in self._arrays]
                f16 = [self._arrays[name(w)][slot] for w in "ab" if name(w) in self._arrays]
                for p in int8 + f16:
                    p.fill(0)
                if stack("dora_scale") in self._arrays:
                    self._arrays[stack("dora_scale")][i, slot] = tensors.get(key + ".g", 1.0)
                if key + ".a" not in tensors:
                    continue
                adapted.add(target)
                if int8:
                    packed = [tensors.get(f"{key}.packed.{w}") for w in PACKED]
                    if any(p is None for p in packed):
                        packed = (*quantize_a(tensors[key + ".a"]), *quantize_b(tensors[key + ".b"]))
                    for dst, src in zip(int8, packed):
                        dst.reshape(-1)[:src.size] = src.reshape(-1)
                if f16:
                    f16[0].reshape(-1)[:f16[0].shape[0] * rank] = tensors[key + ".a"].reshape(-1)  # [in, rank]
                    f16[1][:rank] = tensors[key + ".b"]
        for target in C.LORA_TARGETS:
            self._arrays[C.lora_rank_name(target)][slot] = rank if target in adapted else 0
        self._arrays[C.LORA_SCALE][slot] = scale
        if C.LORA_DORA in self._arrays:
            self._arrays[C.LORA_DORA][slot] = int(dora)

    def pack_adapter(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """tensors plus, when the session holds int8 stacks, each pair's QLinear codes and scales
        (layers.{i}.{target}.packed.{a, a_scale, b, b_scale}): the packing write_adapter_slot would do, done once
        per host copy (AdapterRegistry.host_weights: on the prefetch thread for a queued request) rather than on
        the engine thread at every slot write."""
        if not any(C.lora_stack_name(t, "a") in self._arrays for t in C.LORA_TARGETS):
            return tensors
        out = dict(tensors)
        for key in [k[:-2] for k in tensors if k.endswith(".a")]:
            for w, v in zip(PACKED, (*quantize_a(tensors[key + ".a"]), *quantize_b(tensors[key + ".b"]))):
                out[f"{key}.packed.{w}"] = v
        return out

    def adapter_slot_bytes(self) -> int:
        return sum(a.nbytes for n, a in self._arrays.items() if n.startswith("lora."))

    def _bind_static(self, name: str, arr: np.ndarray) -> None:
        self._arrays[name] = arr
        self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr))

    def _warm_up(self) -> None:
        """A 4-token prefill and a decode in the null block 0 (never read by real sequences)."""
        for start, n in ((0, 4), (4, 1)):
            self.execute([ScheduledSeq("warmup", [1] * n, start, [0], True, None)])

    # ---- per step
    def execute(self, seqs: list[ScheduledSeq], adapter_slots: dict[str | None, int] | None = None,
                all_logits: bool = False) -> np.ndarray:
        """Run one flattened step; returns logits [R, V] for the rows of logits_rows(seqs), in order: a view of a
        buffer the next execute() overwrites (copy it to keep it), and sets self.argmax to their first maxima [R]
        (logits_argmax; likewise a view), and self.hidden to the final hidden states [E, H] of the rows of
        hidden_rows(seqs) (embedding requests; likewise a view). all_logits: [T, V], every row of the step
        (scoring/eval), a new array (self.argmax None).
        The seqs are fed sorted by adapter slot (by_adapter); logits_indices and hidden_indices name each seq's
        rows where they landed, in the seqs' order, so every output comes back in the caller's order with no copy
        (KV writes follow positions and block tables and need nothing)."""
        slots = adapter_slots or {}
        terms = [seq_terms(s.adapter, slots) for s in seqs]      # [(slot, weight), ...] a seq: its adapter mix
        seq_slots = [t[0][0] if t else -1 for t in terms]
        order = by_adapter(seq_slots) if slots else None
        starts_at = None
        self._order = None if order is None else np.asarray(order, np.int64)
        if order is not None:
            starts_at = fed_starts(seqs, order)
            seqs_out, seqs = seqs, [seqs[i] for i in order]
            terms = [terms[i] for i in order]
        # Python lists, one pass per input: cheaper than numpy temporaries for a decode step's few rows, and the
        # step's Python runs in caches cold after the weight stream
        lens = [s.num_tokens for s in seqs]
        starts = [s.start_pos for s in seqs]
        ids = [t for s in seqs for t in s.token_ids]
        if len(ids) == len(seqs):          # one token a seq (decode): a seq's position is its start
            cu, positions = range(len(seqs) + 1), starts
        else:
            cu = [0, *itertools.accumulate(lens)]
            positions = [p for s in seqs for p in range(s.start_pos, s.start_pos + s.num_tokens)]
        width = max(len(s.block_ids) for s in seqs)
        tables = [s.block_ids + [0] * (width - len(s.block_ids)) for s in seqs]   # padded with the null block
        mix_slots, mix_weights = adapter_rows(terms)              # [S, M] each
        if len(ids) != len(seqs):                                 # a row per token
            mix_slots = [r for s, r in zip(seqs, mix_slots) for _ in range(s.num_tokens)]
            mix_weights = [r for s, r in zip(seqs, mix_weights) for _ in range(s.num_tokens)]
        n_terms = len(mix_slots[0])
        if order is None:
            rows = np.arange(len(ids), dtype=np.int64) if all_logits else logits_rows(seqs)
            hidden = hidden_rows(seqs)
        else:                              # in the caller's order, at the rows where its seqs landed
            rows = (np.asarray([r for i, s in enumerate(seqs_out) for r in range(starts_at[i], starts_at[i] +
                                                                                 s.num_tokens)], np.int64)
                    if all_logits else logits_rows(seqs_out, starts_at))
            hidden = hidden_rows(seqs_out, starts_at)

        io = self.io
        for name, value, shape in ((C.ENGINE_INPUT_IDS, ids, (len(ids),)), (C.POSITIONS, positions, (len(ids),)),
                                   (C.CU_SEQLENS, cu, (len(seqs) + 1,)), (C.CONTEXT_LENS, starts, (len(seqs),)),
                                   (C.BLOCK_TABLES, tables, (len(seqs), width)), (C.LOGITS_INDICES, rows, rows.shape),
                                   (C.TOKEN_ADAPTER, mix_slots, (len(ids), n_terms)),
                                   (C.TOKEN_ADAPTER_WEIGHT, mix_weights, (len(ids), n_terms)),
                                   (C.HIDDEN_INDICES, hidden, (len(hidden),))):
            self._bind_step_input(name, value, shape)
        self._bind_hidden(len(hidden))
        self.argmax = None
        if all_logits:                     # [T, V], up to max_batch_tokens rows: ORT allocates it
            io.bind_output(C.LOGITS, "cpu")
            io.bind_output(C.LOGITS_ARGMAX, "cpu")
            self._logits_bound = None
            self._run()
            return io.get_outputs()[0].numpy()
        # [R, V] into a reused buffer: io.get_outputs() would wrap every bound output, the 4 * layers cache
        # outputs too (~0.4 ms a step for SmolLM2's 121)
        if len(rows) > len(self._logits):
            self._logits = np.empty((max(len(rows), 2 * len(self._logits)), self.vocab_size), np.float32)
            self._argmax = np.empty(len(self._logits), np.int64)
            self._logits_bound = None      # a new array may reuse a freed one's id
        out, argmax = self._logits[:len(rows)], self._argmax[:len(rows)]
        # rebinding makes an OrtValue (~40 us in the step): only when the buffer or the rows change. The views start
        # at their arrays' start, so the array's id says where they are (ndarray.ctypes builds an object per use)
        if self._logits_bound != (id(self._logits), len(rows)):
            io.bind_output(C.LOGITS, "cpu", element_type=np.float32, shape=list(out.shape), buffer_ptr=out.ctypes.data)
            io.bind_output(C.LOGITS_ARGMAX, "cpu", element_type=np.int64, shape=[len(rows)],   # moves with them
                           buffer_ptr=argmax.ctypes.data)
            self._logits_bound = (id(self._logits), len(rows))
        self._run()
        self.argmax = argmax
        return out

    def _bind_hidden(self, rows: int) -> None:
        """hidden_states [rows, H] into a reused buffer (self.hidden, a view the next execute() overwrites);
        rebound only when the rows change, so generation steps (0 rows) bind it once."""
        if rows > len(self._hidden):
            self._hidden = np.empty((max(rows, 2 * len(self._hidden)), self.hidden_size), np.float32)
            self._hidden_bound = -1
        if rows != self._hidden_bound:
            self.io.bind_output(C.HIDDEN_STATES, "cpu", element_type=np.float32, shape=[rows, self.hidden_size],
                                buffer_ptr=self._hidden.ctypes.data)
            self._hidden_bound = rows
        self.hidden = self._hidden[:rows]

    def execute_steps(self, seqs: list[ScheduledSeq], adapter_slots: dict[str | None, int] | None, steps: int,
                      stop: np.ndarray | None = None) -> np.ndarray:
        """Up to `steps` greedy decode steps of one token per seq (SchedulerOutput.decode_steps): the first from
        seqs, each next one fed the previous one's logits_argmax, its positions and context lengths one further
        (the seqs' block tables cover every step). Returns [n, S] int64, row j step j's token per seq; n < steps
        when step n's tokens include a `stop` one (a bool [V] table; None: run all steps)."""
        if any(s.num_tokens != 1 or not s.needs_logits or s.spec_token_ids for s in seqs):
            raise ValueError("execute_steps runs decode rows only: one token each, with logits, no drafts")
        out = np.empty((steps, len(seqs)), np.int64)
        self.execute(seqs, adapter_slots)
        out[0] = self.argmax
        order = self._order                # the bound inputs are in by_adapter's order, argmax in the seqs'
        ids, pos, ctx = (self._inputs[n] for n in (C.ENGINE_INPUT_IDS, C.POSITIONS, C.CONTEXT_LENS))
        # every step's positions and context lengths up front ([steps, n] each): between two runs the loop only
        # copies. The first arithmetic ufunc after a run cost ~20 us there (`pos += 1`, whichever came first; the
        # step has evicted numpy's dispatch path from the caches), the copies ~1 us each.
        later = np.arange(steps, dtype=np.int32)[:, None]
        pos_at, ctx_at = pos + later, ctx + later
        for j in range(1, steps):       # the inputs bound by execute(), advanced in place: nothing rebound
            if stop is not None and stop[out[j - 1]].any():
                return out[:j]
            ids[:] = out[j - 1] if order is None else out[j - 1][order]
            pos[:] = pos_at[j]
            ctx[:] = ctx_at[j]
            self._run()
            out[j] = self.argmax
        return out

    def close(self) -> None:
        """Release the session and every buffer bound to it (KV pool, adapter slots, step inputs and outputs) now,
        not when the last reference to the engine goes: its objects refer to each other, so that waits for Python's
        cyclic collector. The runner runs no more steps after this; closing twice is harmless."""
        if self.session is None:
            return
        self.io.clear_binding_inputs()
        self.io.clear_binding_outputs()
        self.io = self.session = None
        self._arrays.clear()
        self._inputs.clear()
        self._logits = self._argmax = self._hidden = None
        self.argmax = self.hidden = None

    def _run(self) -> None:
        t = time.perf_counter()
        self.session.run_with_iobinding(self.io, self.run_options)
        self.run_time_s += time.perf_counter() - t

    def _bind_step_input(self, name: str, value, shape: tuple[int, ...]) -> None:
        """Bind a step input (value: a list, nested for 2-D, a range or an array, of that shape); while the shape
        stays (steady decode), the bound array is overwritten in place and nothing is rebound (binding makes an
        OrtValue: ~10 us each, eight per step)."""
        bound = self._inputs.get(name)
        if bound is None or bound.shape != shape:
            bound = np.empty(shape, C.ENGINE_INPUT_DTYPES[name])
            self._inputs[name] = bound
            self.io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(bound))   # shares bound's memory
        bound[...] = value

    def kv_layout(self) -> KVPoolLayout:
        return KVPoolLayout(self.kv, self.block_size, self.num_blocks, self.bytes_per_block)

    def kv_pool_bytes(self) -> int:
        return sum(a.nbytes for n, a in self._arrays.items() if "cache" in n or "scales" in n)
