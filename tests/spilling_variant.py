"""A user variant in the light class (softmax, no sink, no stepped bias) whose three-consumer
Hopper kernel spills at head_dim 64 while its two-consumer one does not: the codegen tier
checks that premise, the GPU tier that its plans then take two consumers."""

SOURCE = """variant silu_score {
    doc "scores gated by their own sigmoid, causal";
    score = score * sigmoid(score);
    mask = kv_idx <= q_pos;
}
"""
