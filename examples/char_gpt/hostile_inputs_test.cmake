# char_gpt on corpora and flags that once hung it, ate memory or misreported (issue 40): each
# run must end at once with an error that names the problem. Run by the CTest test
# examples.char_gpt_hostile_inputs (examples/CMakeLists.txt):
#   cmake -DCHAR_GPT=/path/to/char_gpt -DWORK_DIR=/scratch/folder -P hostile_inputs_test.cmake
# Each run has a time limit of its own: a reader that blocks (a FIFO) or reads without end
# (/dev/zero) fails by timing out instead of hanging the suite.
foreach(_var CHAR_GPT WORK_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "hostile_inputs_test.cmake: -D${_var}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(_failures 0)
# Runs char_gpt with ARGS (on the CPU: no CUDA initialisation); it must exit with status 1 within
# 60 s, and its stderr must match EXPECT (and not match REJECT, and have at most MAX_LENGTH
# characters, when given). MEMORY_LIMIT_KB caps its address space (ulimit -v), so that a
# regression that reads without end fails here instead of taking the machine's memory.
function(expect_error name)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "EXPECT;REJECT;MAX_LENGTH;MEMORY_LIMIT_KB" "ARGS")
  set(_command "${CHAR_GPT}")
  if(_arg_MEMORY_LIMIT_KB)
    set(_command sh -c "ulimit -v ${_arg_MEMORY_LIMIT_KB} && exec \"$0\" \"$@\"" "${CHAR_GPT}")
  endif()
  execute_process(
    COMMAND ${_command} ${_arg_ARGS} --use_cpu --max_steps 1 --save_strategy no --disable_tqdm
            --output_dir "${WORK_DIR}/out"
    TIMEOUT 60
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  string(LENGTH "${_err}" _length)
  set(_problem "")
  if(NOT _rc STREQUAL "1")
    set(_problem "exit status '${_rc}', expected 1")
  elseif(NOT _err MATCHES "${_arg_EXPECT}")
    set(_problem "stderr does not match '${_arg_EXPECT}'")
  elseif(_arg_REJECT AND _err MATCHES "${_arg_REJECT}")
    set(_problem "stderr matches '${_arg_REJECT}'")
  elseif(_arg_MAX_LENGTH AND _length GREATER _arg_MAX_LENGTH)
    set(_problem "stderr has ${_length} characters, more than ${_arg_MAX_LENGTH}")
  endif()
  if(_problem)
    string(SUBSTRING "${_err}" 0 600 _shown)
    message(STATUS "FAILED ${name}: ${_problem}\n  stdout: ${_out}\n  stderr: ${_shown}")
    math(EXPR _n "${_failures} + 1")
    set(_failures ${_n} PARENT_SCOPE)
  else()
    message(STATUS "passed ${name}")
  endif()
endfunction()

# A FIFO without a writer: gzopen blocked on it forever.
execute_process(COMMAND mkfifo "${WORK_DIR}/corpus.fifo" RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "mkfifo failed (${_rc})")
endif()
expect_error(fifo ARGS --corpus "${WORK_DIR}/corpus.fifo"
             EXPECT "corpus file: cannot read '[^']*corpus\\.fifo': it is a FIFO, not a regular file")

# /dev/zero: read until memory ran out, --max_corpus_chars applied only afterwards. (char_gpt
# starts in well under 4 GiB of address space.)
if(EXISTS /dev/zero)
  expect_error(dev_zero ARGS --corpus /dev/zero --max_corpus_chars 1000 MEMORY_LIMIT_KB 4194304
               EXPECT "'/dev/zero': it is a character device, not a regular file")
endif()

# --max_corpus_chars bounds the read itself: a gzip file whose end is cut off is never read
# that far for its first 1000 characters (the whole file was read, and the cut reported). The
# huge --block_size then stops the run once the text is read, naming the count of characters.
string(REPEAT "The quick brown fox jumps over the lazy dog.\n" 4000 _text)
file(WRITE "${WORK_DIR}/text.txt" "${_text}")
execute_process(COMMAND gzip -c -9 "${WORK_DIR}/text.txt" OUTPUT_FILE "${WORK_DIR}/full.gz"
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "gzip failed (${_rc})")
endif()
file(SIZE "${WORK_DIR}/full.gz" _gz_size)
math(EXPR _kept "${_gz_size} / 2")
execute_process(COMMAND head -c ${_kept} "${WORK_DIR}/full.gz" OUTPUT_FILE "${WORK_DIR}/cut.gz"
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "head failed (${_rc})")
endif()
expect_error(bounded_read ARGS --corpus "${WORK_DIR}/cut.gz" --max_corpus_chars 1000
             --block_size 5000 EXPECT "1000 characters are too few for block_size 5000")
# Without the bound, the same file is read to the cut, and the cut is reported.
expect_error(cut_reported ARGS --corpus "${WORK_DIR}/cut.gz"
             EXPECT "is truncated or corrupt")

# --block_size near the int64 maximum: block_size + 1 overflowed into the message.
expect_error(huge_block_size ARGS --corpus "${WORK_DIR}/text.txt"
             --block_size 9223372036854775807
             EXPECT "too few for block_size 9223372036854775807 .*longer than block_size"
             REJECT "-9223372036854775808")

# A 5000-character path: the message shows its start, "..." and its end, not all of it.
string(REPEAT "a" 5000 _long)
expect_error(long_path ARGS --corpus "${WORK_DIR}/${_long}"
             EXPECT "corpus file '[^']*\\.\\.\\.a+' not found or not readable" MAX_LENGTH 1000)

if(_failures GREATER 0)
  message(FATAL_ERROR "${_failures} char_gpt hostile-input case(s) failed")
endif()
message(STATUS "char_gpt hostile inputs: all cases passed")
