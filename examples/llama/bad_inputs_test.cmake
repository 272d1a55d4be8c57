# train_llama on configs, weights and data files it must refuse: each run has to end with exit
# status 1 and an error naming the bad value. Run by the CTest test examples.llama_bad_inputs:
#   cmake -DTRAIN_LLAMA=/path/to/train_llama -DTINY_CONFIG=tiny_config.json -DWORK_DIR=/scratch
#         -P bad_inputs_test.cmake
foreach(_var TRAIN_LLAMA TINY_CONFIG WORK_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "bad_inputs_test.cmake: -D${_var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
file(READ "${TINY_CONFIG}" _tiny)
# 4000 bytes of text to train on: a plain file read as bytes.
string(REPEAT "All work and no play makes a dull language model. " 80 _text)
file(WRITE "${WORK_DIR}/text.txt" "${_text}")
set(_common --train_file "${WORK_DIR}/text.txt" --block_size 16 --do_train --max_steps 1
            --save_strategy no --disable_tqdm --use_cpu --overwrite_output_dir)

set(_failures 0)
function(expect_error name)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "EXPECT" "ARGS")
  execute_process(COMMAND "${TRAIN_LLAMA}" ${_arg_ARGS} ${_common} --output_dir "${WORK_DIR}/out"
                  TIMEOUT 60 RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc STREQUAL "1")
    set(_problem "exit status '${_rc}', expected 1")
  elseif(NOT _err MATCHES "${_arg_EXPECT}")
    set(_problem "stderr does not match '${_arg_EXPECT}'")
  else()
    message(STATUS "passed ${name}")
    return()
  endif()
  message(STATUS "FAILED ${name}: ${_problem}\n  stdout: ${_out}\n  stderr: ${_err}")
  math(EXPR _n "${_failures} + 1")
  set(_failures ${_n} PARENT_SCOPE)
endfunction()

# A config variant: the tiny config with one text replaced.
function(write_config file from to)
  string(REPLACE "${from}" "${to}" _json "${_tiny}")
  if(_json STREQUAL _tiny)
    message(FATAL_ERROR "bad_inputs_test.cmake: '${from}' is not in ${TINY_CONFIG}")
  endif()
  file(WRITE "${WORK_DIR}/${file}" "${_json}")
endfunction()

write_config(yarn.json "\"rope_type\": \"default\"" "\"rope_type\": \"yarn\", \"factor\": 4.0")
expect_error(unknown_rope_type ARGS --config_name "${WORK_DIR}/yarn.json"
             EXPECT "yarn\\.json: rope_parameters: rope_type \"yarn\" is not supported")
write_config(no_hidden.json "\"hidden_size\": 64," "")
expect_error(missing_key ARGS --config_name "${WORK_DIR}/no_hidden.json"
             EXPECT "no_hidden\\.json: the key \"hidden_size\" is missing")
write_config(mistral.json "\"model_type\": \"llama\"" "\"model_type\": \"mistral\"")
expect_error(other_model_type ARGS --config_name "${WORK_DIR}/mistral.json"
             EXPECT "model_type \"mistral\" is not a Llama model")
write_config(gelu.json "\"rms_norm_eps\"" "\"hidden_act\": \"gelu\", \"rms_norm_eps\"")
expect_error(other_activation ARGS --config_name "${WORK_DIR}/gelu.json"
             EXPECT "hidden_act \"gelu\" is not supported")
write_config(heads.json "\"num_key_value_heads\": 2" "\"num_key_value_heads\": 3")
expect_error(heads_not_grouped ARGS --config_name "${WORK_DIR}/heads.json"
             EXPECT "num_attention_heads \\(4\\) must be a positive multiple of num_key_value_heads \\(3\\)")
write_config(small_vocab.json "\"vocab_size\": 256" "\"vocab_size\": 100")
expect_error(bytes_beyond_vocab ARGS --config_name "${WORK_DIR}/small_vocab.json"
             EXPECT "holds token id 121, but the model's vocab_size is 100")

# A token file whose header promises more ids than it holds.
# CMake cannot write NUL bytes: printf writes the 32-byte header (2 bytes per id, 100 ids,
# vocab 256) and 10 ids' worth of bytes.
execute_process(COMMAND printf "MTSTOK01\\002\\000\\000\\000\\000\\000\\000\\000\\144\\000\\000\\000\\000\\000\\000\\000\\000\\001\\000\\000\\000\\000\\000\\000abcdefghijklmnopqrst"
                OUTPUT_FILE "${WORK_DIR}/short.tok" RESULT_VARIABLE _rc)
expect_error(token_file_truncated ARGS --config_name "${TINY_CONFIG}" --validation_file "${WORK_DIR}/short.tok"
             EXPECT "token file '[^']*short\\.tok': the header promises 100 ids of 2 bytes, the file holds 20 bytes")

# A model folder whose config.json does not fit its weights: saved from the tiny config, then
# given a wider MLP.
execute_process(COMMAND "${TRAIN_LLAMA}" --config_name "${TINY_CONFIG}" ${_common}
                        --output_dir "${WORK_DIR}/saved" RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "bad_inputs_test.cmake: training the folder to corrupt failed: ${_err}")
endif()
write_config(saved/config.json "\"intermediate_size\": 192" "\"intermediate_size\": 128")
expect_error(shape_mismatch ARGS --model_name_or_path "${WORK_DIR}/saved"
             EXPECT "model\\.safetensors: size mismatch for model\\.layers\\.0\\.mlp\\.gate_proj\\.weight: the checkpoint has shape \\[192, 64\\], the model \\[128, 64\\]")
# The same folder as shards whose index points outside it.
file(REMOVE "${WORK_DIR}/saved/model.safetensors")
file(WRITE "${WORK_DIR}/saved/model.safetensors.index.json"
     "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}")
expect_error(index_outside_folder ARGS --model_name_or_path "${WORK_DIR}/saved"
             EXPECT "the shard of \"model\\.norm\\.weight\" must be a file name inside the folder, got \"\\.\\./\\.\\./etc/passwd\"")

if(_failures GREATER 0)
  message(FATAL_ERROR "train_llama bad inputs: ${_failures} case(s) failed")
endif()
message(STATUS "train_llama bad inputs: all cases passed")
