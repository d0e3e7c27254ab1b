"""Tiny vision-language configs shared by the harness tests and the recipe tests."""

from __future__ import annotations

# A LLaVA-1.5 of the published layout at toy sizes: a 2-layer Llama decoder, a 3-layer CLIP tower on 56 x 56 crops of
# 14-pixel patches (16 patches and the CLS position, 16 image tokens per image), the MLP projector
TINY_LLAVA = {
    "model_type": "llava",
    "architectures": ["LlavaForConditionalGeneration"],
    "image_token_index": 500,
    "projector_hidden_act": "gelu",
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                    "max_position_embeddings": 4096},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 3, "num_attention_heads": 2, "image_size": 56, "patch_size": 14},
}

# A Gemma 3 of the published layout at toy sizes: a 2-layer Gemma3 decoder (one sliding layer of window 8, one full),
# a 2-layer SigLIP tower on 56 px images (4 x 4 patches of 14 px) pooled 2 x 2 into 4 soft tokens
TINY_GEMMA3 = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "mm_tokens_per_image": 4,
    "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                    "sliding_window": 8, "sliding_window_pattern": 2, "max_position_embeddings": 4096},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56, "patch_size": 14,
                      "vision_use_head": False},
}

# A Llama 3.2 Vision (Mllama) of the published layout at toy sizes: a 3-layer decoder whose layer 1 is a
# cross-attention layer, a tower of 3 local and 1 gated global layers on 56 px tiles (4 x 4 patches of 14 px and the
# CLS position, padded to 24), up to 4 tiles an image, layers 0 and 2 joining the final output (3 x 32 = 96 wide)
TINY_MLLAMA = {
    "model_type": "mllama",
    "architectures": ["MllamaForConditionalGeneration"],
    "image_token_index": 512,
    "text_config": {"model_type": "mllama_text_model", "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 3, "cross_attention_layers": [1], "num_attention_heads": 4,
                    "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096,
                    "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
    "vision_config": {"model_type": "mllama_vision_model", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 3, "num_global_layers": 1, "attention_heads": 2, "image_size": 56,
                      "patch_size": 14, "max_num_tiles": 4, "intermediate_layers_indices": [0, 2],
                      "vision_output_dim": 96,
                      "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]},
}

# A LLaVA-NeXT of the published layout at toy sizes: TINY_LLAVA's decoder, tower and projector, anyres on 56 px
# crops over a grid of 56 x 112, 112 x 56 and 112 x 112 (the base image and up to 4 tiles an image), image_newline
TINY_LLAVA_NEXT = {**TINY_LLAVA, "model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"],
                   "image_grid_pinpoints": [[56, 112], [112, 56], [112, 112]], "use_image_newline_parameter": True}

# An Idefics3 (SmolVLM's layout) at toy sizes: a 2-layer Llama decoder, a 2-layer SigLIP-like tower on 56 px tiles of
# 14 px patches (16 positions a tile), the pixel-shuffle connector (2 x 2 patches a token: 4 tokens a tile)
TINY_IDEFICS3 = {
    "model_type": "idefics3",
    "architectures": ["Idefics3ForConditionalGeneration"],
    "image_token_id": 500,
    "scale_factor": 2,
    "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
                    "max_position_embeddings": 4096, "pad_token_id": 0},
    "vision_config": {"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 56, "patch_size": 14},
}
