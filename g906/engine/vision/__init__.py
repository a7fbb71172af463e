"""Qwen3.5 vision: config, image preprocessing, the vision tower, weights from mmproj GGUF files
and HF checkpoints, M-RoPE positions and prompt placeholder expansion (docs/multimodal.md).

Modules: config (VisionConfig), image (fetch/decode/limits/preprocess), tower (VisionTower),
weights (HF and mmproj loaders), mrope (positions, step rotary tables), inputs
(MultimodalInputs, expand_prompt, step_inputs), runtime (VisionRuntime, load_vision)."""
