"""Reading a chat model's output back into OpenAI's message parts: tool calls (per model
family's format) and reasoning, whole or as stream deltas. Pure text in, plain data out."""
