// `fsdp` and `fsdp_config`: what is accepted, what is refused and with which words, on the
// command line and in training_args.json. The sharded runs themselves are fsdp.* (CTest,
// tests/fsdp_trainer_check.cpp).
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mantissa/training_arguments.h>

#include "training_arguments/fsdp_checks.h"

namespace {

using mantissa::TrainingArguments;
using ::testing::HasSubstr;

std::string validate_error(const TrainingArguments& args) {
  try {
    args.validate();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string("<not a c10::ValueError: ") + e.what() + ">";
  }
  return "<no exception>";
}

TrainingArguments sharded() { return TrainingArguments().fsdp("shard_grad_op"); }

TEST(FsdpArguments, OffByDefaultAndShardGradOpAccepted) {
  EXPECT_FALSE(TrainingArguments().fsdp_shards_grad_op());
  EXPECT_FALSE(TrainingArguments().fsdp_shards_parameters());
  EXPECT_TRUE(sharded().fsdp_shards_grad_op());
  EXPECT_FALSE(sharded().fsdp_shards_parameters());
  EXPECT_EQ(validate_error(sharded()), "<no exception>");
  // HF's spellings: options separated by spaces (or commas); auto_wrap changes nothing here.
  EXPECT_TRUE(TrainingArguments().fsdp("shard_grad_op auto_wrap").fsdp_shards_grad_op());
  EXPECT_TRUE(TrainingArguments().fsdp("auto_wrap,shard_grad_op").fsdp_shards_grad_op());
  EXPECT_EQ(validate_error(TrainingArguments().fsdp("shard_grad_op auto_wrap")), "<no exception>");
  EXPECT_FALSE(TrainingArguments().fsdp("false").fsdp_shards_parameters());
}

TEST(FsdpArguments, BareFsdpAndFullShardShardTheParameters) {
  // HF 5: a bare --fsdp is FSDP2 with reshard_after_forward true; full_shard the old name of it.
  for (const char* fsdp : {"true", "True", "full_shard", "full_shard auto_wrap", "auto_wrap"}) {
    EXPECT_TRUE(TrainingArguments().fsdp(fsdp).fsdp_shards_parameters()) << fsdp;
    EXPECT_FALSE(TrainingArguments().fsdp(fsdp).fsdp_shards_grad_op()) << fsdp;
    EXPECT_EQ(validate_error(TrainingArguments().fsdp(fsdp)), "<no exception>") << fsdp;
  }
  const auto bare = TrainingArguments::parse(std::vector<std::string>{"--fsdp", "--max_steps", "3"});
  EXPECT_EQ(bare.fsdp(), "true");
  EXPECT_EQ(bare.max_steps(), 3);
  EXPECT_TRUE(bare.fsdp_shards_parameters());
  EXPECT_TRUE(TrainingArguments::parse(std::vector<std::string>{"--fsdp"}).fsdp_shards_parameters());
  // A key of fsdp_config wins over what the legacy string implies, as HF's setdefault lets it.
  EXPECT_TRUE(sharded().fsdp_config(R"({"reshard_after_forward": true})").fsdp_shards_parameters());
  EXPECT_TRUE(TrainingArguments()
                  .fsdp("full_shard")
                  .fsdp_config(R"({"reshard_after_forward": "no"})")
                  .fsdp_shards_grad_op());
  EXPECT_TRUE(TrainingArguments()
                  .fsdp("true")
                  .fsdp_config(R"({"fsdp_reshard_after_forward": false})")
                  .fsdp_shards_grad_op());
}

TEST(FsdpArguments, FsdpOneOptionsAndContradictionsAreRefusedByName) {
  for (const char* option : {"no_shard", "hybrid_shard", "hybrid_shard_zero2"}) {
    const auto error = validate_error(TrainingArguments().fsdp(option));
    EXPECT_THAT(error, HasSubstr(std::string("fsdp: '") + option + "' is an FSDP1 option"));
  }
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("full_shard offload")),
              HasSubstr("fsdp: 'offload' is not supported"));
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("shard_grad_op full_shard")),
              HasSubstr("'full_shard' and 'shard_grad_op' contradict each other"));
  // FSDPOption's match is case-sensitive in HF too.
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("FULL_SHARD")),
              HasSubstr("fsdp: 'FULL_SHARD' is not an FSDP option"));
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("shard_grad_opp")),
              HasSubstr("fsdp: 'shard_grad_opp' is not an FSDP option"));
}

TEST(FsdpArguments, FsdpTwoConfigKeys) {
  const TrainingArguments full = TrainingArguments().fsdp("true");
  for (const char* policy : {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}) {
    EXPECT_EQ(validate_error(TrainingArguments(full).fsdp_config(
                  std::string(R"({"auto_wrap_policy": ")") + policy + R"(", "min_num_params": 10})")),
              "<no exception>")
        << policy;
  }
  EXPECT_THAT(validate_error(TrainingArguments(full).fsdp_config(R"({"auto_wrap_policy": "wrap"})")),
              HasSubstr("'auto_wrap_policy' takes TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or "
                        "NO_WRAP, got \"wrap\""));
  EXPECT_THAT(validate_error(TrainingArguments(full).fsdp_config(R"({"version": 1})")),
              HasSubstr("version 1 (FSDP1, deprecated in HF Transformers 5) is not supported"));
  EXPECT_THAT(
      validate_error(TrainingArguments(full).fsdp_config(R"({"reshard_after_forward": "maybe"})")),
      HasSubstr("'reshard_after_forward' takes true or false (or a string such as \"yes\""));
  EXPECT_THAT(validate_error(TrainingArguments(full).fsdp_config(
                  R"({"transformer_layer_cls_to_wrap": []})")),
              HasSubstr("'transformer_layer_cls_to_wrap' names no class"));
  EXPECT_THAT(validate_error(TrainingArguments(full).fsdp_config(R"({"forward_prefetch": true})")),
              HasSubstr("'forward_prefetch' true is an FSDP1 setting"));
  EXPECT_THAT(validate_error(TrainingArguments(full).fsdp_config(R"({"cpu_offload": "true"})")),
              HasSubstr("'cpu_offload' true is not supported"));
  EXPECT_EQ(validate_error(TrainingArguments(full).fsdp_config(
                R"({"cpu_ram_efficient_loading": "true", "activation_checkpointing": true})")),
            "<no exception>");
  EXPECT_THAT(validate_error(TrainingArguments(full)
                                 .gradient_checkpointing(true)
                                 .fsdp_config(R"({"activation_checkpointing": true})")),
              HasSubstr("activation_checkpointing and --gradient_checkpointing both"));
  // The refusals of a sharded run name the mode.
  EXPECT_THAT(validate_error(TrainingArguments(full).optim("sgd")),
              HasSubstr("fsdp (full sharding) shards the state of adamw_torch_fused by flat "
                        "element ranges, and that of adafactor, adamw_torch_8bit, muon by "
                        "whole tensors; optim 'sgd' cannot be sharded"));
}

TEST(FsdpArguments, WhatShardingCannotCombineWith) {
  EXPECT_THAT(validate_error(sharded().optim("adamw_torch")),
              HasSubstr("optim 'adamw_torch' cannot be sharded"));
  EXPECT_THAT(validate_error(sharded().optim("sgd")), HasSubstr("optim 'sgd' cannot be sharded"));
  EXPECT_EQ(validate_error(sharded().optim("adamw_mantissa_fused")), "<no exception>");
  EXPECT_THAT(validate_error(sharded().save_on_each_node(true)),
              HasSubstr("save_on_each_node must be false"));
  EXPECT_THAT(validate_error(sharded().cuda_graph(true)), HasSubstr("cuda_graph must be false"));
}

TEST(FsdpArguments, ConfigAsJsonObject) {
  EXPECT_EQ(validate_error(sharded().fsdp_config(
                R"({"state_dict_type": "FULL_STATE_DICT", "fsdp_reshard_after_forward": false,
                    "use_orig_params": true, "sync_module_states": true, "version": 2,
                    "backward_prefetch": "backward_pre", "min_num_params": 0,
                    "transformer_layer_cls_to_wrap": ["Block"], "offload_params": false})")),
            "<no exception>");
  EXPECT_EQ(validate_error(sharded().fsdp_config(R"({"state_dict_type": "SHARDED_STATE_DICT"})")),
            "<no exception>");
  EXPECT_TRUE(mantissa::detail::read_fsdp_settings("true", R"({"state_dict_type": "SHARDED_STATE_DICT"})")
                  .sharded_state_dict);
  EXPECT_FALSE(mantissa::detail::read_fsdp_settings("true", R"({"state_dict_type": "FULL_STATE_DICT"})")
                   .sharded_state_dict);
  EXPECT_FALSE(mantissa::detail::read_fsdp_settings("true", std::nullopt).sharded_state_dict);
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"state_dict_type": "LOCAL_STATE_DICT"})")),
              HasSubstr("state_dict_type \"LOCAL_STATE_DICT\" is not a state dict type"));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"fsdp_offload_params": true})")),
              HasSubstr("'fsdp_offload_params' true is not supported"));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"use_orig_params": "yes"})")),
              HasSubstr("'use_orig_params' takes true or false, got \"yes\""));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"version": 3})")),
              HasSubstr("'version' is 1 or 2, got 3"));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"limit_all_gather": true})")),
              HasSubstr("unknown key 'limit_all_gather'"));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"version": )")),
              HasSubstr("fsdp_config is not valid JSON"));
  EXPECT_THAT(validate_error(sharded().fsdp_config("[1, 2]")),
              HasSubstr("neither a JSON object nor a JSON file that exists"));
  // Checked without sharding too (HF warns that it is unused).
  EXPECT_EQ(validate_error(TrainingArguments().fsdp_config("{}")), "<no exception>");
  EXPECT_THAT(validate_error(TrainingArguments().fsdp_config(R"({"version": 7})")),
              HasSubstr("'version' is 1 or 2, got 7"));
}

TEST(FsdpArguments, ConfigAsFile) {
  const std::string path = ::testing::TempDir() + "/fsdp_config_test.json";
  std::ofstream(path) << R"({"fsdp_state_dict_type": "FULL_STATE_DICT"})";
  EXPECT_EQ(validate_error(sharded().fsdp_config(path)), "<no exception>");
  std::ofstream(path) << R"({"xla": true})";
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)),
              HasSubstr("'xla' true is not supported"));
  std::ofstream(path) << "[]";
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)),
              HasSubstr("must hold a JSON object, not array"));
  std::remove(path.c_str());
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)),
              HasSubstr("neither a JSON object nor a JSON file that exists"));
}

TEST(FsdpArguments, ConfigValuesOfKnownKeysAreChecked) {
  // accelerate upper-cases backward_prefetch and takes FSDP_BACKWARD_PREFETCH's names.
  for (const char* value :
       {R"("BACKWARD_PRE")", R"("backward_post")", R"("No_Prefetch")", "null"}) {
    EXPECT_EQ(validate_error(
                  sharded().fsdp_config(std::string(R"({"backward_prefetch": )") + value + "}")),
              "<no exception>")
        << value;
  }
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"backward_prefetch": "sometimes"})")),
              HasSubstr("fsdp_config: 'backward_prefetch' takes backward_pre, backward_post or "
                        "no_prefetch (in any case) or null, got \"sometimes\""));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"fsdp_backward_prefetch": 1})")),
              HasSubstr("'fsdp_backward_prefetch' takes backward_pre"));
  EXPECT_EQ(validate_error(sharded().fsdp_config(R"({"transformer_layer_cls_to_wrap": "Block"})")),
            "<no exception>");
  EXPECT_THAT(
      validate_error(sharded().fsdp_config(R"({"transformer_layer_cls_to_wrap": ["Block", 3]})")),
      HasSubstr("'transformer_layer_cls_to_wrap' takes a list of class names, but entry 1 is 3, "
                "not a string"));
  EXPECT_THAT(validate_error(
                  sharded().fsdp_config(R"({"fsdp_transformer_layer_cls_to_wrap": [["Block"]]})")),
              HasSubstr("entry 0 is [\"Block\"], not a string"));
}

TEST(FsdpArguments, ConfigIsReadAsCheckedJson) {
  // A million levels: the message's value.dump() recursed until the stack overflowed (SIGSEGV).
  // The reader refuses the nesting before nlohmann builds anything.
  const std::size_t depth = 1'000'000;
  const std::string deep =
      R"({"version": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
  EXPECT_THAT(validate_error(sharded().fsdp_config(deep)),
              HasSubstr("fsdp_config is not valid JSON: arrays and objects nest deeper than 127 "
                        "levels"));
  // As a file, and within the limit the value is named in a short message.
  const std::string path = ::testing::TempDir() + "/fsdp_config_deep.json";
  std::ofstream(path) << deep;
  const auto from_file = validate_error(sharded().fsdp_config(path));
  EXPECT_THAT(from_file, HasSubstr("fsdp_config '" + path + "' is not valid JSON"));
  EXPECT_THAT(from_file, HasSubstr("nest deeper than 127 levels"));
  std::remove(path.c_str());
  const std::string within =
      R"({"version": )" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_THAT(validate_error(sharded().fsdp_config(within)),
              HasSubstr("'version' is 1 or 2, got [[[[[[["));
  // What nlohmann alone would let through: text after a NUL, a byte-order mark.
  EXPECT_THAT(validate_error(sharded().fsdp_config(std::string("{\"version\": 2}\0{junk", 20))),
              HasSubstr("fsdp_config is not valid JSON: a NUL byte at offset 14"));
  std::ofstream(path) << "\xEF\xBB\xBF{}";
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)), HasSubstr("byte-order mark"));
  std::remove(path.c_str());
}

TEST(FsdpArguments, LongKeysAndValuesAreShortened) {
  const std::string huge(100'000, 'x');
  const auto long_key = validate_error(sharded().fsdp_config(R"({")" + huge + R"(": true})"));
  EXPECT_THAT(long_key, HasSubstr("fsdp_config: unknown key 'xxxx"));
  EXPECT_LT(long_key.size(), 1000u);
  const auto long_bool_key =
      validate_error(sharded().fsdp_config(R"({"use_orig_params": ")" + huge + R"("})"));
  EXPECT_THAT(long_bool_key, HasSubstr("'use_orig_params' takes true or false, got \"xxxx"));
  EXPECT_LT(long_bool_key.size(), 300u);
  // A value of the wrong type for each key that takes a value: an object with a 100 KB key.
  const std::string huge_object = R"({")" + huge + R"(": 1})";
  for (const char* key : {"state_dict_type", "version", "backward_prefetch", "min_num_params",
                          "transformer_layer_cls_to_wrap"}) {
    const auto message = validate_error(
        sharded().fsdp_config(std::string(R"({")") + key + R"(": )" + huge_object + "}"));
    EXPECT_THAT(message, HasSubstr(R"({"xxxx)"));
    EXPECT_THAT(message, HasSubstr("..."));
    EXPECT_LT(message.size(), 500u) << key;
  }
  const auto entry = validate_error(sharded().fsdp_config(
      R"({"transformer_layer_cls_to_wrap": ["Block", )" + huge_object + "]}"));
  EXPECT_THAT(entry, HasSubstr(R"(entry 1 is {"xxxx)"));
  EXPECT_LT(entry.size(), 500u);
  for (const std::string& fsdp : {huge, "shard_grad_op " + huge, "no_shard " + huge}) {
    const auto message = validate_error(TrainingArguments().fsdp(fsdp));
    EXPECT_THAT(message, HasSubstr("fsdp: '"));
    EXPECT_LT(message.size(), 600u);
  }
}

TEST(FsdpArguments, CommandLineAndJsonRoundTrip) {
  const auto parsed = TrainingArguments::parse(std::vector<std::string>{
      "--fsdp", "shard_grad_op auto_wrap", "--fsdp_config", R"({"version": 2})"});
  EXPECT_EQ(parsed.fsdp(), "shard_grad_op auto_wrap");
  ASSERT_TRUE(parsed.fsdp_config().has_value());
  EXPECT_EQ(*parsed.fsdp_config(), R"({"version": 2})");
  const auto json = parsed.to_json();
  EXPECT_THAT(json, HasSubstr("\"fsdp\": \"shard_grad_op auto_wrap\""));
  EXPECT_EQ(TrainingArguments::from_json(json), parsed);
  EXPECT_THAT(TrainingArguments::help_text(), HasSubstr("--fsdp"));
}

}  // namespace
