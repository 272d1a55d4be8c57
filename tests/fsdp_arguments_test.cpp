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
  EXPECT_TRUE(sharded().fsdp_shards_grad_op());
  EXPECT_EQ(validate_error(sharded()), "<no exception>");
  // HF's spellings: options separated by spaces (or commas); auto_wrap changes nothing here.
  EXPECT_TRUE(TrainingArguments().fsdp("shard_grad_op auto_wrap").fsdp_shards_grad_op());
  EXPECT_TRUE(TrainingArguments().fsdp("auto_wrap,shard_grad_op").fsdp_shards_grad_op());
  EXPECT_EQ(validate_error(TrainingArguments().fsdp("shard_grad_op auto_wrap")), "<no exception>");
  EXPECT_FALSE(TrainingArguments().fsdp("no_shard").fsdp_shards_grad_op());
  EXPECT_EQ(validate_error(TrainingArguments().fsdp("no_shard")), "<no exception>");
}

TEST(FsdpArguments, OptionsThatShardParametersAreRefusedByName) {
  for (const char* option : {"full_shard", "hybrid_shard", "hybrid_shard_zero2", "offload"}) {
    const auto error = validate_error(TrainingArguments().fsdp(std::string("shard_grad_op ") +
                                                               option));
    EXPECT_THAT(error, HasSubstr(std::string("fsdp: '") + option + "' is not supported"));
    EXPECT_THAT(error, HasSubstr("use --fsdp shard_grad_op"));
  }
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("shard_grad_opp")),
              HasSubstr("fsdp: 'shard_grad_opp' is not an FSDP option"));
  EXPECT_THAT(validate_error(TrainingArguments().fsdp("no_shard shard_grad_op")),
              HasSubstr("'no_shard' cannot be combined"));
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
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"state_dict_type": "SHARDED_STATE_DICT"})")),
              HasSubstr("state_dict_type \"SHARDED_STATE_DICT\" is not supported"));
  EXPECT_THAT(validate_error(sharded().fsdp_config(R"({"reshard_after_forward": true})")),
              HasSubstr("'reshard_after_forward' true shards the parameters too"));
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
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)), HasSubstr("'xla' true is not supported"));
  std::ofstream(path) << "[]";
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)),
              HasSubstr("must hold a JSON object, not array"));
  std::remove(path.c_str());
  EXPECT_THAT(validate_error(sharded().fsdp_config(path)),
              HasSubstr("neither a JSON object nor a JSON file that exists"));
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
