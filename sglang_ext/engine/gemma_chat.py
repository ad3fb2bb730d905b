"""Gemma's chat turn format, attached by `model_store` to the Gemma-3-270M conversion.

The packaged GGUF holds the base model, which carries no chat template. Gemma-3-it's turns look
like `<start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n`; Gemma has no system role,
so a system message opens the first user turn, followed by a blank line. Written here from
that description (not copied), rendered by transformers' `apply_chat_template`.
"""

GEMMA_END_OF_TURN = "<end_of_turn>"

GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.prefix = message['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + ns.prefix + message['content'] + '<end_of_turn>\\n' }}"
    "{%- set ns.prefix = '' -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
