"""benchmarks/step_profile.py: the categoriser on hand-written records, the HLO reader and cost
model on a hand-written module, the GPU trace reader on a hand-written XSpace, and both
breakdowns of a tiny model compiled and run on this CPU (their parts sum to their totals)."""

import json

import pytest
from jax._src.profiler import ProfileData

from benchmarks import roofline, step_profile
from benchmarks.step_profile import Op, categorize
from sparse_jax.configs import default
from sparse_jax.tasks import task_for

H100 = roofline.PEAKS["NVIDIA H100 80GB HBM3"]
TRAIN_STEP = "steps:make_train_step.<locals>.train_step"
ATTENTION = ("xl_attention:RelativeMultiHeadAttention.__call__", "blocks:DecoderBlock._attend",
             "blocks:DecoderBlock.__call__", TRAIN_STEP)

CASES = [
    # A projection of the attention layer is a plain GEMM.
    (Op("gemm_fusion_dot.3", "fusion", "jit(train_step)/jvp(btd,dhc->bthc)/dot_general",
        ATTENTION, fused=("dot", "parameter")), "matmuls"),
    # The score GEMM of the attention core, a cuBLAS call.
    (Op("cublas-lt-matmul.97", "custom-call", "jit(train_step)/jvp(bthc,bkhc->bhtk)/dot_general",
        ("precision:_narrow_f32_einsum", "xl_attention:attend_relative", *ATTENTION),
        target="__cublas$lt$matmul"), "attention"),
    # Its softmax (backward).
    (Op("fusion.2395", "fusion", "jit(train_step)/transpose(jvp(jit(_where)))/select_n",
        ("xl_attention:attend_relative", *ATTENTION), fused=("select", "multiply", "parameter")),
     "attention"),
    # The Transformer-XL shift is attention even though it is a pad.
    (Op("input_transpose_fusion.96", "fusion", "jit(train_step)/jvp(jit(_pad))/pad",
        ("xl_attention:rel_shift", "xl_attention:attend_relative", *ATTENTION),
        fused=("pad", "parameter", "transpose")), "attention"),
    # A pad XLA put on a GEMM operand (d_model 412 -> 416), and a transpose before a GEMM.
    (Op("loop_pad_fusion.7", "fusion", "jit(train_step)/jvp(btd,dhc->bthc)/dot_general",
        ATTENTION, fused=("bitcast", "constant", "convert", "pad", "parameter")), "copies"),
    (Op("loop_transpose_fusion.8", "fusion", "jit(train_step)/jvp(bkd,dhc->bkhc)/dot_general",
        ATTENTION, fused=("parameter", "transpose")), "copies"),
    # A pad that also computes the LayerNorm feeding the GEMM is the LayerNorm's.
    (Op("loop_pad_fusion.9", "fusion", "jit(train_step)/jvp(btd,dhc->bthc)/dot_general",
        ("normalization:LayerNorm.__call__", TRAIN_STEP),
        fused=("add", "multiply", "pad", "parameter", "subtract")), "norms_elementwise"),
    (Op("copy.297", "copy"), "copies"),
    (Op("MemcpyD2D"), "copies"),  # a kernel known by name only
    (Op("loop_xor_fusion.3", "fusion", "jit(train_step)/jvp()/threefry2x32", ATTENTION),
     "dropout_rng"),
    (Op("loop_add_fusion.38", "fusion",
        "jit(train_step)/jit(_threefry_fold_in)/reseed.<locals>.<dictcomp>/add",
        ("rngs:reseed", TRAIN_STEP)), "dropout_rng"),
    (Op("rng-bit-generator.1", "rng-bit-generator"), "dropout_rng"),
    # Outside the differentiated loss: the optimizer's update and the gradient norm.
    (Op("loop_add_fusion.12", "fusion", "jit(train_step)/add", (TRAIN_STEP,)), "optimizer"),
    (Op("loop_sqrt_fusion", "fusion", "jit(train_step)/sqrt", (TRAIN_STEP,)), "optimizer"),
    (Op("input_reduce_fusion.4", "fusion", "jit(train_step)/reduce_sum", (TRAIN_STEP,)),
     "optimizer"),
    # The backward of a LayerNorm is not the optimizer.
    (Op("input_reduce_fusion.35", "fusion", "jit(train_step)/transpose(jvp())/mul",
        ("normalization:LayerNorm.__call__", TRAIN_STEP)), "norms_elementwise"),
    # MoE: our kernels, the router, the slot sort; SwitchHead's expert projections.
    (Op("pallas_call.12", "custom-call",
        "jit(train_step)/jvp(jit(segment_matmul))/cvmm_segment_matmul/pallas_call",
        ("triton_matmul:segment_matmul", "expert_mlp:_fused_fwd", "moe:MoE.__call__"),
        target="__gpu$xla.gpu.triton"), "moe"),
    # Pallas kernels known by the names they launch under only (H200 traces of a step run
    # as a CUDA graph, 2026-11-28), and the fused attention's custom call.
    (Op("cvmm_weight_grad__1"), "moe"),
    (Op("cvmm_segment_matmul"), "moe"),
    (Op("xl_attention_dq"), "attention"),
    (Op("xl_attention_forward"), "attention"),
    (Op("custom-call.31", "custom-call",
        "jit(train_step)/jvp(jit(_xl_attention))/xl_attention_dkdv/pallas_call",
        ("xl_attention:_backward", "xl_attention:RelativeMultiHeadAttention.__call__"),
        target="__gpu$xla.gpu.triton"), "attention"),
    (Op("loop_add_fusion_15"), "norms_elementwise"),
    (Op("fusion.59", "fusion", "jit(train_step)/jvp()/top_k",
        ("sigma:SigmaRouter.__call__", "moe:MoE.__call__")), "moe"),
    (Op("gemm_fusion_dot.40", "fusion", "jit(train_step)/jvp(btd,edc->bthc)/dot_general",
        ("switchhead_attention:SwitchHeadAttention.project_v",
         "switchhead_attention:SwitchHeadXLAttention.apply_with_aux")), "moe"),
    # The output layer.
    (Op("custom-call.5", "custom-call", "jit(train_step)/jvp(...d,dv->...v)/dot_general",
        ("precision:_narrow_f32_einsum", "lm:TransformerLM.logits"), target="__cublas$gemm"),
     "matmuls"),
    (Op("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), "matmuls"),
    (Op("ynn_fusion.43", "fusion", "jit(train_step)/jvp(btd,dhc->bthc)/dot_general", ATTENTION,
        fused=("convert", "dot", "parameter")), "matmuls"),  # XLA:CPU's dot fusion
    # The embedding's gradient, a scatter.
    (Op("input_scatter_fusion.8", "fusion",
        "jit(train_step)/transpose(jvp(jit(_take)))/scatter-add", ("lm:TransformerLM._embed",),
        fused=("parameter", "scatter")), "other"),
    (Op("triton_softmax.17", "fusion", "jit(train_step)/jvp(jit(log_softmax))/sub",
        ("lm_evaluation:cross_entropy",)), "norms_elementwise"),
]


@pytest.mark.parametrize("op,category", CASES, ids=[op.name for op, _ in CASES])
def test_categorize_sorts_operations_by_what_they_do(op, category):
  assert categorize(op) == category


def test_fusion_root_reads_xla_fusion_names():
  assert step_profile.fusion_root("loop_pad_fusion.3") == "pad"
  assert step_profile.fusion_root("input_dynamic_update_slice_fusion") == "dynamic_update_slice"
  assert step_profile.fusion_root("wrapped_transpose.1") == "transpose"
  assert step_profile.fusion_root("copy.3") == ""


HLO = """HloModule jit_step, is_scheduled=true

FileNames
1 "/repo/sparse_jax/training/steps.py"
2 "/repo/sparse_jax/layers/xl_attention.py"

FunctionNames
1 "make_train_step.<locals>.train_step"
2 "attend_relative"
3 "rel_shift"

FileLocations
1 {file_name_id=1 function_name_id=1 line=100 end_line=100 column=1 end_column=9}
2 {file_name_id=2 function_name_id=2 line=70 end_line=70 column=1 end_column=9}
3 {file_name_id=2 function_name_id=3 line=45 end_line=45 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=3}


%fused_slice (param_0: f32[64,128]) -> f32[8,128] {
  %param_0 = f32[64,128]{1,0} parameter(0)
  ROOT %slice.1 = f32[8,128]{1,0} slice(%param_0), slice={[0:8], [0:128]}
}

%fused_update (param_0.1: f32[64,128], param_1.1: f32[8,128], param_2: s32[]) -> f32[64,128] {
  %param_0.1 = f32[64,128]{1,0} parameter(0)
  %param_1.1 = f32[8,128]{1,0} parameter(1)
  %param_2 = s32[] parameter(2)
  %constant_0 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[64,128]{1,0} dynamic-update-slice(%param_0.1, %param_1.1, %param_2, %constant_0)
}

%gemm_computation (param_0.2: bf16[32,64], param_1.2: bf16[64,16]) -> bf16[32,16] {
  %param_0.2 = bf16[32,64]{1,0} parameter(0)
  %param_1.2 = bf16[64,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[32,16]{1,0} dot(%param_0.2, %param_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/jvp(bthc,bkhc->bhtk)/dot_general" stack_frame_id=2}
}

%fused_add (param_0.3: f32[64,128]) -> f32[64,128] {
  %param_0.3 = f32[64,128]{1,0} parameter(0)
  ROOT %add.1 = f32[64,128]{1,0} add(%param_0.3, %param_0.3), metadata={op_name="jit(step)/jvp()/add"}
}

%body (p: (s32[], f32[64,128])) -> (s32[], f32[64,128]) {
  %p = (s32[], f32[64,128]{1,0}) parameter(0)
  %get-tuple-element.1 = s32[] get-tuple-element(%p), index=0
  %get-tuple-element.2 = f32[64,128]{1,0} get-tuple-element(%p), index=1
  %loop_add_fusion.2 = f32[64,128]{1,0} fusion(%get-tuple-element.2), kind=kLoop, calls=%fused_add
  ROOT %tuple.1 = (s32[], f32[64,128]{1,0}) tuple(%get-tuple-element.1, %loop_add_fusion.2)
}

%cond (q: (s32[], f32[64,128])) -> pred[] {
  %q = (s32[], f32[64,128]{1,0}) parameter(0)
  %get-tuple-element.3 = s32[] get-tuple-element(%q), index=0
  %constant_4 = s32[] constant(4)
  ROOT %compare.1 = pred[] compare(%get-tuple-element.3, %constant_4), direction=LT
}

ENTRY %main (a: f32[64,128], x: bf16[32,64], w: bf16[64,16], i: s32[]) -> (f32[64,128], bf16[32,16]) {
  %a = f32[64,128]{1,0} parameter(0)
  %x = bf16[32,64]{1,0} parameter(1)
  %w = bf16[64,16]{1,0} parameter(2)
  %i = s32[] parameter(3)
  %loop_slice_fusion = f32[8,128]{1,0} fusion(%a), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(step)/jvp()/slice" stack_frame_id=3}
  %loop_dynamic_update_slice_fusion = f32[64,128]{1,0} fusion(%a, %loop_slice_fusion, %i), kind=kLoop, calls=%fused_update
  %gemm_fusion_dot = bf16[32,16]{1,0} fusion(%x, %w), kind=kCustom, calls=%gemm_computation, metadata={op_name="jit(step)/jvp(bthc,bkhc->bhtk)/dot_general" stack_frame_id=2}, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64","block_n":"32","block_k":"64","split_k":"2","num_stages":"4","num_warps":"4","num_ctas":"1"}}}
  %custom-call.1 = (bf16[32,16]{1,0}, s8[1024]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}, metadata={op_name="jit(step)/jvp(btd,dhc->bthc)/dot_general"}
  %tuple.2 = (s32[], f32[64,128]{1,0}) tuple(%i, %loop_dynamic_update_slice_fusion)
  %while.1 = (s32[], f32[64,128]{1,0}) while(%tuple.2), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  %get-tuple-element.4 = f32[64,128]{1,0} get-tuple-element(%while.1), index=1
  %get-tuple-element.5 = bf16[32,16]{1,0} get-tuple-element(%custom-call.1), index=0
  ROOT %tuple.3 = (f32[64,128]{1,0}, bf16[32,16]{1,0}) tuple(%get-tuple-element.4, %get-tuple-element.5)
}
"""


@pytest.fixture(scope="module")
def module():
  return step_profile.parse_hlo(HLO)


def test_parse_hlo_reads_computations_and_source_stacks(module):
  assert module.name == "jit_step" and module.entry == "main"
  assert len(module.computations) == 7
  assert module.stacks[3] == ("xl_attention:rel_shift", "xl_attention:attend_relative",
                              "steps:make_train_step.<locals>.train_step")
  gemm = module.by_name["gemm_fusion_dot"]
  assert gemm.operands == ["x", "w"] and gemm.called("calls") == ["gemm_computation"]
  assert module.op(gemm).stack[0] == "xl_attention:attend_relative"
  assert module.op(module.by_name["custom-call.1"]).target == "__cublas$gemm"


def test_launches_walk_loops_by_their_trip_count(module):
  runs = {inst.name: times for inst, times in step_profile.launches(module)}
  assert runs == {"loop_slice_fusion": 1, "loop_dynamic_update_slice_fusion": 1,
                  "gemm_fusion_dot": 1, "custom-call.1": 1, "loop_add_fusion.2": 4,
                  "compare.1": 5}


def test_launch_costs_count_matmul_flops_and_the_bytes_moved(module):
  cost = {name: step_profile.launch_cost(module, module.by_name[name])
          for name in ("loop_slice_fusion", "loop_dynamic_update_slice_fusion",
                       "gemm_fusion_dot", "custom-call.1", "loop_add_fusion.2")}
  # Only the sliced rows are read; an in-place update writes its update only.
  assert (cost["loop_slice_fusion"].flops, cost["loop_slice_fusion"].bytes) == (0, 2 * 8 * 128 * 4)
  assert cost["loop_dynamic_update_slice_fusion"].bytes == 8 * 128 * 4 * 2 + 4
  gemm_bytes = (32 * 64 + 64 * 16 + 32 * 16) * 2  # the cuBLAS workspace is not counted
  for name in ("gemm_fusion_dot", "custom-call.1"):
    assert (cost[name].flops, cost[name].bytes, cost[name].narrow) == (2 * 32 * 16 * 64,
                                                                       gemm_bytes, True)
  assert cost["loop_add_fusion.2"].bytes == 2 * 64 * 128 * 4


def test_deviceless_categories_sum_to_the_total(module):
  report = step_profile.deviceless_report(HLO, H100)
  check_deviceless_sums(report, module)
  by_category = {c["category"]: c for c in report["categories"]}
  assert by_category["attention"]["launches"] == 2  # the shift and the score GEMM
  assert by_category["matmuls"]["flops"] == 2 * 32 * 16 * 64
  assert by_category["copies"]["launches"] == 1
  assert by_category["norms_elementwise"]["launches"] == 9  # the loop's add 4x, its test 5x
  gemm_s = max(2 * 32 * 16 * 64 / (989e12), (32 * 64 + 64 * 16 + 32 * 16) * 2 / 3.35e12)
  assert by_category["matmuls"]["floor_ms"] == pytest.approx(gemm_s * 1e3)


def check_deviceless_sums(report, module):
  """Categories' floors, FLOPs, bytes and launches add up to the totals; the launches are
  the program's."""
  categories, total = report["categories"], report["total"]
  assert [c["category"] for c in categories] == list(step_profile.CATEGORIES)
  for key in ("floor_ms", "flops", "bytes", "launches"):
    assert sum(c[key] for c in categories) == pytest.approx(total[key])
  assert sum(c["share"] for c in categories) == pytest.approx(1.0)
  assert total["launches"] == sum(times for _, times in step_profile.launches(module))
  assert sum(report["launch_kinds"].values()) == total["launches"]
  floors = [t["floor_ms"] for t in report["top"]]
  assert floors == sorted(floors, reverse=True)


XSPACE = """
planes {
  id: 1 name: "/device:GPU:0"
  lines {
    id: 7 name: "Stream #7(Kernel,MemcpyD2D)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 4000000
             stats { metadata_id: 1 ref_value: 11 } stats { metadata_id: 2 ref_value: 10 } }
    events { metadata_id: 2 offset_ps: 5000000 duration_ps: 2000000
             stats { metadata_id: 1 ref_value: 12 } stats { metadata_id: 2 ref_value: 10 } }
    events { metadata_id: 3 offset_ps: 8000000 duration_ps: 1000000
             stats { metadata_id: 2 ref_value: 10 } }
    events { metadata_id: 1 offset_ps: 9000000 duration_ps: 4000000
             stats { metadata_id: 1 ref_value: 11 } stats { metadata_id: 2 ref_value: 10 } }
    events { metadata_id: 4 offset_ps: 14000000 duration_ps: 9000000
             stats { metadata_id: 1 ref_value: 13 } stats { metadata_id: 2 ref_value: 14 } }
  }
  lines { id: 8 name: "CUPTI overhead" timestamp_ns: 1000
          events { metadata_id: 4 offset_ps: 0 duration_ps: 9000000 } }
  event_metadata { key: 1 value { id: 1 name: "gemm_fusion_dot" } }
  event_metadata { key: 2 value { id: 2 name: "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n" } }
  event_metadata { key: 3 value { id: 3 name: "loop_add_fusion_2" } }
  event_metadata { key: 4 value { id: 4 name: "other_program_kernel" } }
  stat_metadata { key: 1 value { id: 1 name: "hlo_op" } }
  stat_metadata { key: 2 value { id: 2 name: "hlo_module" } }
  stat_metadata { key: 10 value { id: 10 name: "jit_step" } }
  stat_metadata { key: 11 value { id: 11 name: "gemm_fusion_dot" } }
  stat_metadata { key: 12 value { id: 12 name: "custom-call.1" } }
  stat_metadata { key: 13 value { id: 13 name: "fusion.1" } }
  stat_metadata { key: 14 value { id: 14 name: "jit_other" } }
}
planes {
  id: 2 name: "/host:CPU"
  lines { id: 1 name: "tf_XLAPjRtCpuClient/1" timestamp_ns: 1000
          events { metadata_id: 1 offset_ps: 0 duration_ps: 99000000
                   stats { metadata_id: 1 ref_value: 11 } stats { metadata_id: 2 ref_value: 10 } } }
  event_metadata { key: 1 value { id: 1 name: "host_thunk" } }
  stat_metadata { key: 1 value { id: 1 name: "hlo_op" } }
  stat_metadata { key: 2 value { id: 2 name: "hlo_module" } }
  stat_metadata { key: 10 value { id: 10 name: "jit_step" } }
  stat_metadata { key: 11 value { id: 11 name: "gemm_fusion_dot" } }
}
"""


def test_gpu_kernels_are_read_from_the_device_streams_and_categorised(module):
  events = step_profile.kernel_events(ProfileData.from_text_proto(XSPACE), "jit_step")
  # The GPU's stream line only (not the host's thunks, nor CUPTI's overhead), this program's.
  assert [(e.kernel, e.hlo_op, e.duration_ns) for e in events] == [
      ("gemm_fusion_dot", "gemm_fusion_dot", 4000.0),
      ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "custom-call.1", 2000.0),
      ("loop_add_fusion_2", "", 1000.0), ("gemm_fusion_dot", "gemm_fusion_dot", 4000.0)]
  summary = step_profile.summarize_device(module, events, steps=2, wall_ms=0.01)
  ms = {c["category"]: c["ms"] for c in summary["categories"]}
  # By hlo_op; the annotation-less kernel by its name, which is its fusion's.
  assert ms == {**dict.fromkeys(step_profile.CATEGORIES, 0.0), "attention": 0.004,
                "matmuls": 0.001, "norms_elementwise": 0.0005}
  assert summary["total"]["ms"] == pytest.approx(0.0055)
  assert summary["total"]["kernels"] == 2
  assert summary["total"]["device_over_wall"] == pytest.approx(0.55)
  assert [(t["name"], t["calls"]) for t in summary["top"]] == [
      ("gemm_fusion_dot", 1), ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 0.5),
      ("loop_add_fusion_2", 0.5)]
  # Idle: 4-5 us and 7-8 us of the trace (ps offsets / 1000), over 2 steps.
  assert summary["idle"]["ms"] == pytest.approx(0.001) and summary["idle"]["gaps"] == 1
  assert summary["idle"]["largest"][0] == {
      "ms": pytest.approx(0.001), "after": "gemm_fusion_dot",
      "before": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"}
  assert summary["top"][0]["launch"]["floor_ms"] is None  # no peaks given


def test_top_kernels_carry_their_launchs_floor_shapes_and_gemm_tiles(module):
  """bf16[32,64] x bf16[64,16]: 2 * 32 * 16 * 64 FLOPs, 32*64 + 64*16 + 32*16 elements of 2
  bytes; the H200's 4.8 TB/s makes it memory-bound; XLA's tiling from the backend config."""
  events = step_profile.kernel_events(ProfileData.from_text_proto(XSPACE), "jit_step")
  summary = step_profile.summarize_device(module, events, steps=2, wall_ms=0.01,
                                          peaks=roofline.device_peaks("NVIDIA H200"))
  launch = summary["top"][0]["launch"]
  assert launch["flops"] == 2 * 32 * 16 * 64 and launch["bytes"] == 2 * (32 * 64 + 64 * 16
                                                                         + 32 * 16)
  assert launch["floor_ms"] == pytest.approx(1e3 * launch["bytes"] / 4.8e12)
  assert launch["shapes"] == "bf16[32,64], bf16[64,16] -> bf16[32,16]"
  assert launch["tiles"] == "block_m=64 block_n=32 block_k=64 split_k=2 stages=4 warps=4"
  assert summary["top"][1]["launch"]["tiles"] == ""  # a cuBLAS call
  report = {"config": "c", "mode": "device", "device_kind": "NVIDIA H200", "dtype": "bfloat16",
            "batch_size": 1, "seq_len": 1, "module": "jit_step", "warmup": 1, **summary}
  markdown = step_profile.markdown(report)
  assert "block_m=64 block_n=32" in markdown and "Idle between the kernels" in markdown


def tiny_moe_lm():
  """A two-layer sigma-MoE Transformer-XL on one device (as tests/aot's)."""
  config = default.get_config()
  config.data.update(batch_size=4, seq_len=16)
  config.model.update(d_model=32, n_layers=2, n_heads=2, head_dim=16, mem_len=16)
  config.model.ff.update(n_experts=4, expert_size=16, k=2)
  config.mesh.update(data=1)
  return config


def test_deviceless_breakdown_of_a_compiled_step_sums_consistently():
  """The tiny model's training step compiled for this CPU, read as the H100 breakdown reads
  its program (against the H100's peaks)."""
  text = step_profile.compile_step(task_for(tiny_moe_lm()))[0].as_text()
  report = step_profile.deviceless_report(text, H100)
  check_deviceless_sums(report, step_profile.parse_hlo(text))
  floor = {c["category"]: c["floor_ms"] for c in report["categories"]}
  for category in ("matmuls", "attention", "moe", "optimizer", "norms_elementwise"):
    assert floor[category] > 0, category
  assert report["total"]["flops"] > 0


def test_deviceless_breakdown_counts_scanned_layers_by_their_trip_count():
  """With `model.scan_layers` each layer's operations sit once in a while loop's body: counted
  times its trip count, the scanned step has the unrolled step's matmul FLOPs (the
  rematerialisation policy under a scan recomputes no matmul) in a shorter program. The
  experts run `ragged`: the CPU's default, `blocked`, loops over blocks in its forward, and
  JAX recomputes a loop in the backward pass under any rematerialisation (models.remat)."""
  def report(scan: bool, n_layers: int):
    config = tiny_moe_lm()
    config.model.update(scan_layers=scan, n_layers=n_layers)
    config.model.ff.impl = "ragged"
    text = step_profile.compile_step(task_for(config))[0].as_text()
    return step_profile.deviceless_report(text, H100), text

  unrolled, unrolled_text = report(False, 4)
  scanned, scanned_text = report(True, 4)
  assert scanned["total"]["flops"] == pytest.approx(unrolled["total"]["flops"], rel=1e-6)
  assert not scanned.get("unknown_trip_counts")
  assert len(scanned_text) < len(unrolled_text)


def test_device_breakdown_on_this_cpu_writes_its_tables(tmp_path):
  report = step_profile.main([f"--config={default.__file__}", "--config.data.batch_size=4",
                              "--config.data.seq_len=16", "--config.model.d_model=32",
                              "--config.model.n_layers=1", "--config.model.ff.n_experts=4",
                              "--config.model.ff.expert_size=16", "--config.mesh.data=1",
                              "--device", "--steps=1", "--warmup=1", f"--out={tmp_path}"])
  assert report["mode"] == "device" and report["model"] == "default"
  categories = report["categories"]
  assert sum(c["ms"] for c in categories) == pytest.approx(report["total"]["ms"])
  assert sum(c["kernels"] for c in categories) == pytest.approx(report["total"]["kernels"])
  assert report["total"]["ms"] > 0 and report["total"]["wall_ms"] > 0
  ms = {c["category"]: c["ms"] for c in categories}
  assert ms["moe"] > 0 and ms["attention"] > 0 and ms["optimizer"] > 0
  written = json.loads((tmp_path / "step_profile_default_cpu.json").read_text())
  assert written["total"] == report["total"]
  markdown = (tmp_path / "step_profile_default_cpu.md").read_text()
  assert "| **kernels' sum** |" in markdown and "Measured step (wall, untraced)" in markdown
