# Compiles every ```cpp block of README.md and docs/**/*.md, so that the documentation cannot
# drift from the code. The convention (docs/building.md, "Code samples in the docs"):
#
# - A block that contains `int main(` is a complete program, whose `main` comes last in the
#   block. It is compiled as written, at namespace scope (`main` renamed, and given the
#   `return 0;` that `main` may leave out); the build also registers a ctest test that runs it with the Trainer flags
#   of MANTISSA_DOC_SNIPPET_RUN_ARGS (a program that reads no flags ignores them).
# - Any other block is a fragment: it is compiled as the body of a member function of a struct
#   derived from `mantissa_docs::Context` (tests/docs/prelude.h), whose members supply the names
#   such fragments take for granted (`model`, `optimizer`, `loader`, `x`, `y`, `loss_fn`, ...).
#   Fragments are compiled and linked, not run.
# - `#include` lines are moved in front of everything else (their line is left blank), so a
#   block shows the header it needs without pulling it into a namespace.
# - Each block gets its own namespace, so two pages may both define `struct NetImpl`.
# - A `#line` directive before each block makes the compiler report errors at the block's line
#   in the .md file ("docs/grad_scaler.md:27: error: ...").
# - Only ```cpp is compiled. To show C++ that must not compile, fence it as ```text. A block
#   fenced as ```c++, ```cxx or ```cc is a configure error, so nothing escapes the check by a
#   spelling.
#
# All blocks go into one translation unit and one executable (one compile with the shared
# precompiled header, one link), which also holds a small driver: `docs_snippets --list`,
# `docs_snippets --check`, `docs_snippets <id> [flags...]` to run a program.

set(MANTISSA_DOC_SNIPPET_RUN_ARGS
  --max_steps 3 --per_device_train_batch_size 16 --disable_tqdm
  --overwrite_output_dir
  CACHE STRING "Flags every complete program of the docs is run with (plus --output_dir)")

# Appends one snippet to the generated source in `_out_var`; `_registry_var` collects the
# registry rows and `_programs_var` the ids of complete programs.
# Drops the first `count` characters of the text in variable `rest_var` and adds the newlines
# among them to the line counter in `line_var`.
macro(_mantissa_doc_consume rest_var line_var count)
  string(SUBSTRING "${${rest_var}}" 0 ${count} _consumed_text)
  string(REGEX MATCHALL "\n" _consumed_newlines "${_consumed_text}")
  list(LENGTH _consumed_newlines _consumed_count)
  math(EXPR ${line_var} "${${line_var}} + ${_consumed_count}")
  string(SUBSTRING "${${rest_var}}" ${count} -1 ${rest_var})
endmacro()

function(_mantissa_doc_snippet_emit file line body out_var registry_var programs_var includes_var)
  set(_closing "")
  string(MAKE_C_IDENTIFIER "${file}" _id)
  set(_ns "${_id}_L${line}")
  set(_name "${file}:${line}")
  math(EXPR _first "${line} + 1")

  # Hoist #include lines; keep their line blank so the #line numbering stays true.
  string(REGEX MATCHALL "(^|\n)[ \t]*#[ \t]*include[^\n]*" _incs "${body}")
  set(_includes "${${includes_var}}")
  foreach(_inc IN LISTS _incs)
    string(STRIP "${_inc}" _inc)
    string(APPEND _includes "${_inc}\n")
  endforeach()
  set(${includes_var} "${_includes}" PARENT_SCOPE)
  string(REGEX REPLACE "(^|\n)[ \t]*#[ \t]*include[^\n]*" "\\1" body "${body}")

  set(_out "${${out_var}}")
  set(_registry "${${registry_var}}")
  if(body MATCHES "(^|\n)int main\\(")
    string(REGEX REPLACE "(^|\n)int main\\(" "\\1int snippet_main(" body "${body}")
    # `main` may end without a return; `snippet_main` may not. `main` comes last in its block,
    # so its closing brace is the block's last one: put a `return 0;` in front of it (on the
    # same line, so the numbering stays true).
    string(FIND "${body}" "}" _last REVERSE)
    if(_last EQUAL -1)
      message(FATAL_ERROR "${file}:${line}: a block with `int main(` but no closing brace")
    endif()
    string(SUBSTRING "${body}" 0 ${_last} _head)
    string(SUBSTRING "${body}" ${_last} -1 _tail)
    set(body "${_head}return 0; ${_tail}")
    string(APPEND _out "namespace ${_ns} {\n#line ${_first} \"${file}\"\n${body}\n")
    string(APPEND _registry "  {\"${_name}\", mantissa_docs::program<&${_ns}::snippet_main>(), nullptr},\n")
    set(_programs "${${programs_var}}")
    list(APPEND _programs "${_name}")
    set(${programs_var} "${_programs}" PARENT_SCOPE)
  else()
    string(APPEND _out "namespace ${_ns} {\nstruct Snippet : mantissa_docs::Context {\n  void run() {\n"
                       "#line ${_first} \"${file}\"\n${body}\n")
    set(_closing "  }\n};\nvoid compile_only(mantissa_docs::Context& context) { static_cast<Snippet&>(context).run(); }\n")
    string(APPEND _registry "  {\"${_name}\", nullptr, &${_ns}::compile_only},\n")
  endif()
  # Back to the generated file's own numbering for what follows the block: the file's fixed
  # head (_MANTISSA_DOC_SNIPPET_HEAD_LINES lines), then `_out`, then this directive.
  string(REGEX MATCHALL "\n" _newlines "${_out}")
  list(LENGTH _newlines _lines)
  math(EXPR _next "${_MANTISSA_DOC_SNIPPET_HEAD_LINES} + ${_lines} + 2")
  string(APPEND _out "#line ${_next} \"${_MANTISSA_DOC_SNIPPET_GENERATED}\"\n${_closing}}  // namespace ${_ns}\n\n")
  set(${out_var} "${_out}" PARENT_SCOPE)
  set(${registry_var} "${_registry}" PARENT_SCOPE)
endfunction()

# Writes `content` to `path` only when it changed, so that a re-configure does not force a
# recompile.
function(_mantissa_write_if_changed path content)
  file(WRITE "${path}.tmp" "${content}")
  file(COPY_FILE "${path}.tmp" "${path}" ONLY_IF_DIFFERENT)
  file(REMOVE "${path}.tmp")
endfunction()

# mantissa_add_doc_snippets(<target> FILES <md files relative to the project root>...)
# Generates <binary dir>/docs_snippets.cpp and an executable <target> built from it, and
# registers the tests `docs.snippets` and `docs.<file>:<line>` (one per complete program).
function(mantissa_add_doc_snippets target)
  cmake_parse_arguments(PARSE_ARGV 1 _arg "" "" "FILES")
  set(_MANTISSA_DOC_SNIPPET_GENERATED "${CMAKE_CURRENT_BINARY_DIR}/docs_snippets.cpp")
  set(_MANTISSA_DOC_SNIPPET_HEAD_LINES 7)  # the lines written before the blocks, below
  set(_source "")
  set(_registry "")
  set(_programs "")
  set(_includes "")
  set(_count 0)
  foreach(_file IN LISTS _arg_FILES)
    set(_path "${PROJECT_SOURCE_DIR}/${_file}")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_path}")
    file(READ "${_path}" _text)
    string(REPLACE "\r\n" "\n" _text "${_text}")
    if(_text MATCHES "\n[ \t]+```(cpp|c\\+\\+)")
      message(FATAL_ERROR "${_file}: an indented ```cpp block: only blocks whose fence starts "
                          "the line are compiled, so start it at column 0")
    endif()
    # A leading newline lets a fence on line 1 match "\n```"; `_line` is the line number of
    # the first character of `_rest`.
    set(_rest "\n${_text}")
    set(_line 0)
    while(TRUE)
      string(FIND "${_rest}" "\n```" _pos)
      if(_pos EQUAL -1)
        break()
      endif()
      math(EXPR _pos "${_pos} + 1")
      _mantissa_doc_consume(_rest _line ${_pos})
      # The opening fence: ```<info string>
      string(FIND "${_rest}" "\n" _eol)
      if(_eol EQUAL -1)
        message(FATAL_ERROR "${_file}:${_line}: code fence at the end of the file")
      endif()
      math(EXPR _len "${_eol} - 3")
      string(SUBSTRING "${_rest}" 3 ${_len} _info)
      string(STRIP "${_info}" _info)
      string(REGEX REPLACE "[ \t].*" "" _info "${_info}")
      string(SUBSTRING "${_rest}" ${_eol} -1 _rest)
      set(_fence_line ${_line})
      # The block runs to the next line that starts with ```.
      string(FIND "${_rest}" "\n```" _close)
      if(_close EQUAL -1)
        message(FATAL_ERROR "${_file}:${_fence_line}: code block is not closed")
      endif()
      set(_body "")
      if(_close GREATER 0)
        math(EXPR _len "${_close} - 1")
        string(SUBSTRING "${_rest}" 1 ${_len} _body)
      endif()
      math(EXPR _consumed "${_close} + 1")
      _mantissa_doc_consume(_rest _line ${_consumed})
      # Skip the closing fence's own line, so it cannot be taken for an opening one.
      string(FIND "${_rest}" "\n" _eol)
      if(_eol EQUAL -1)
        set(_rest "")
      else()
        string(SUBSTRING "${_rest}" ${_eol} -1 _rest)
      endif()

      if(_info STREQUAL "cpp")
        _mantissa_doc_snippet_emit("${_file}" ${_fence_line} "${_body}" _source _registry _programs _includes)
        math(EXPR _count "${_count} + 1")
      elseif(_info MATCHES "^(c\\+\\+|C\\+\\+|cxx|cc|hpp|h)$")
        message(FATAL_ERROR "${_file}:${_fence_line}: a ```${_info} block: fence C++ as ```cpp "
                            "(compiled by the build) or as ```text (not compiled)")
      endif()
    endwhile()
  endforeach()

  set(_generated "${_MANTISSA_DOC_SNIPPET_GENERATED}")
  # The hoisted #include lines go into a header of their own, so that the .cpp's head has a
  # fixed number of lines (_MANTISSA_DOC_SNIPPET_HEAD_LINES) for the #line bookkeeping.
  _mantissa_write_if_changed("${CMAKE_CURRENT_BINARY_DIR}/docs_snippets_includes.h"
    "// Generated: the #include lines of the docs' ```cpp blocks.\n#pragma once\n${_includes}")
  string(CONCAT _text
    "// Generated by cmake/MantissaDocSnippets.cmake from the ```cpp blocks of the docs. Do not edit.\n"
    "#include \"prelude.h\"\n"
    "#include \"docs_snippets_includes.h\"\n"
    "\n"
    "namespace mantissa_docs_snippets {\n"
    "using namespace mantissa_docs;\n"
    "\n"
    "${_source}"
    "const mantissa_docs::Entry kEntries[] = {\n${_registry}};\n"
    "}  // namespace mantissa_docs_snippets\n\n"
    "int main(int argc, char** argv) {\n"
    "  return mantissa_docs::run_driver(mantissa_docs_snippets::kEntries, ${_count}, argc, argv);\n"
    "}\n")
  _mantissa_write_if_changed("${_generated}" "${_text}")

  add_executable(${target} "${_generated}")
  target_include_directories(${target} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/docs")
  target_link_libraries(${target} PRIVATE mantissa::mantissa CLI11::CLI11)
  mantissa_use_pch(${target})

  add_test(NAME docs.snippets COMMAND ${target} --check)
  set_tests_properties(docs.snippets PROPERTIES LABELS cpu
    PASS_REGULAR_EXPRESSION "docs_snippets: ${_count} blocks")
  foreach(_name IN LISTS _programs)
    string(MAKE_C_IDENTIFIER "${_name}" _dir)
    add_test(NAME docs.${_name}
      COMMAND ${target} ${_name} ${MANTISSA_DOC_SNIPPET_RUN_ARGS}
              --output_dir "${CMAKE_CURRENT_BINARY_DIR}/docs-run/${_dir}")
    set_tests_properties(docs.${_name} PROPERTIES LABELS cpu)
  endforeach()
  message(STATUS "mantissa: ${_count} C++ blocks from the docs compiled into ${target}")
endfunction()
