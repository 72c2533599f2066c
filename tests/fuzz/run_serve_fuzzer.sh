#!/usr/bin/env bash
# Builds the HTTP/JSON request fuzzer with clang (libFuzzer + AddressSanitizer + UBSan) and runs
# it for a bounded time. Usage: run_serve_fuzzer.sh SOURCE_DIR BUILD_DIR SECONDS
source "$(dirname "$0")/fuzz_common.sh"
fuzz_begin serve "$@"
fuzz_build \
  -DSY_FUZZ_TOKENIZER_DIR="\"$src/configs/tokenizer/default\"" \
  "$src/src/serve/openai_api.cc" "$src/src/serve/responses_api.cc" \
  "$src/src/serve/messages_api.cc" "$src/src/serve/conversations_api.cc" \
  "$src/src/serve/files_api.cc" \
  "$src/src/engine/sampling.cc" \
  "$src/src/tokenizer/bpe.cc" "$src/src/tokenizer/chat_template.cc" "$src/src/tokenizer/deepseek_v32_encoding.cc" "$src"/src/jinja/*.cc \
  "$src/src/tokenizer/pre_tokenizer.cc" "$src/src/tokenizer/tokenizer.cc" \
  "$src/src/tokenizer/text_codec.cc" "$src/src/tokenizer/unicode.cc" "$src/src/tokenizer/tiktoken.cc" "$src"/src/structured/*.cc \
  "$src"/src/chat_output/*.cc "$src/src/serve/responses_store.cc" \
  "$src/src/tokenizer/gguf_tokenizer.cc" "$src/src/model/gguf.cc" "$src/src/tensor/ggml_quants.cc" \
  "$src/src/tensor/dtype.cc" "$src/src/base/mapped_file.cc" "$src/src/base/utf8.cc" \
  "$src/src/base/partial_file.cc" \
  $(pkg-config --cflags --libs libpcre2-8) -lxxhash -lfmt -lcrypto
# Seeds: bodies the client tests send, raw and as HTTP requests.
seed() { printf '%s' "$2" > "$corpus/$1"; }
seed body-completion $'\x00{"model":"fuzz","prompt":"Hello","max_tokens":5,"temperature":0.5,"logprobs":2,"echo":true,"stop":["a"],"n":2,"logit_bias":{"5":1.5}}'
seed body-budget $'\x02{"messages":[{"role":"user","content":"hi"}],"thinking_token_budget":7,"response_format":{"type":"json_object"}}'
seed body-effort $'\x24{"input":"hi","reasoning":{"effort":"low","summary":"auto"},"previous_response_id":"resp_1"}'
seed body-vllm-extras $'\x00{"prompt":"def f():","suffix":"  return 1","priority":3,"service_tier":"flex","prompt_logprobs":2,"return_token_ids":true,"thinking_token_budget":4}'
seed multipart $'\x80multipart/form-data; boundary="b x"\n--b x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--b x\r\nContent-Disposition: form-data; name="file"; filename="a\\"b.jsonl"\r\nContent-Type: application/octet-stream\r\n\r\n{"custom_id":"1"}\n\r\n--b x--\r\n'
seed message-batch $'\xc0{"requests":[{"custom_id":"a-1","params":{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}},{"custom_id":"b_2","params":{}}]}'
seed body-ids $'\x00{"prompt":[[1,2,3],[4,5]],"stream":true,"stream_options":{"include_usage":true},"seed":3}'
seed body-chat $'\x02{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":2,"chat_template_kwargs":{"thinking":true}}'
seed body-grammar $'\x00{"prompt":"x","max_tokens":3,"guided_json":{"type":"object","properties":{"a":{"type":"integer","maximum":9}}}}'
seed body-format $'\x02{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"enum":["x","y"]}}}}'
seed body-responses $'\x04{"model":"fuzz","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"instructions":"be brief","max_output_tokens":9,"text":{"format":{"type":"json_schema","name":"n","schema":{"enum":["x","y"]}}}}'
seed body-responses-text $'\x0c{"input":"hi","stream":true,"temperature":0.3,"top_p":0.9,"store":false,"metadata":{"a":"b"}}'
seed body-tools $'\x02{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}],"tool_choice":"required","parallel_tool_calls":false}'
seed body-tools-format $'\x02{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"enum":[1,2]}}}}}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"b":{"type":"boolean"}}}}},"parallel_tool_calls":false}'
seed body-forced-format $'\x02{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}}'
seed body-responses-chain $'\x24{"input":[{"type":"function_call_output","call_id":"call_1","output":"ok"}],"previous_response_id":"resp_1","instructions":"x"}'
seed body-responses-store $'\x24{"input":"hi","store":false,"previous_response_id":"resp_9"}'
seed query-items $'\x24limit=2&order=asc&after=msg_1_in0'
seed body-conversation $'\x24{"items":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"c","output":"ok"}],"metadata":{"a":"b"}}'
seed body-messages $'\x40{"model":"fuzz","max_tokens":9,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"},{"type":"text","text":"and?"}]}],"tools":[{"name":"f","input_schema":{"type":"object","properties":{"a":{"type":"integer"}}}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"stop_sequences":["x"]}'
seed body-messages-prefill $'\x40{"model":"fuzz","max_tokens":9,"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"<think>So"}]}]}'
seed dsml-output $'\x04ok\n\n<\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>\n<\xef\xbd\x9cDSML\xef\xbd\x9cinvoke name="f">\n<\xef\xbd\x9cDSML\xef\xbd\x9cparameter name="a" string="true">x"y</\xef\xbd\x9cDSML\xef\xbd\x9cparameter>\n</\xef\xbd\x9cDSML\xef\xbd\x9cinvoke>\n</\xef\xbd\x9cDSML\xef\xbd\x9cfunction_calls>'
seed body-chat-continue $'\x0a{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Once"}],"continue_final_message":true,"add_generation_prompt":false}'
seed body-messages-thread $'\x60{"model":"fuzz","max_tokens":9,"thread":{"type":"continue","previous_message_id":"msg_1"},"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"ok"}]}]}'
seed body-messages-create $'\x60{"model":"fuzz","max_tokens":9,"system":"s","thread":{"type":"create"},"messages":[{"role":"user","content":"hi"}]}'
seed body-messages-format $'\x48{"model":"fuzz","max_tokens":2000,"stream":true,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024},"output_config":{"format":{"type":"json_schema","schema":{"enum":["x"]}}}}'
seed body-named $'\x0a{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}},"stream":true}'
seed output-v3 $'\x04ok</think>x<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
seed output-v31 $'\x04<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
seed body-tokens $'\x00{"tokens":[1,2,3],"prompt":"x","add_special_tokens":false}'
seed body-tokenize-tools $'\x10{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"parameters":{"type":"object"},"name":"f"}}],"chat_template_kwargs":{"thinking":true}}'
seed body-responses-logprobs $'\x0c{"input":"hi","include":["message.output_text.logprobs"],"top_logprobs":2}'
seed http-completion $'\x01POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 33\r\n\r\n{"prompt":"hi","max_tokens":2}   '
seed http-chunked $'\x03POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2d\r\n{"messages":[{"role":"user","content":"hi"}]}\r\n0\r\n\r\n'
fuzz_run 8192
