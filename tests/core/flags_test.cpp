// The flag registry (core/flags.h): values come from the environment, are validated, can be overridden
// for a scope, and the table documents every flag. Reading the environment is checked in a child
// process (a death-test fork), because a flag is read once per process and other tests read them too.
#include "core/flags.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"

namespace dpt {
namespace {

TEST(Flags, EveryFlagIsDeclaredOnceInEnumOrder) {
  std::set<std::string> names;
  for (size_t i = 0; i < flag_specs().size(); ++i) {
    const FlagSpec& s = flag_specs()[i];
    EXPECT_EQ(static_cast<size_t>(s.flag), i) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " declared twice";
    EXPECT_EQ(std::string(s.name).rfind("DPT_", 0), 0u) << s.name;
    if (!s.allowed.empty()) {
      bool default_allowed = false;
      for (const char* a : s.allowed) default_allowed |= std::string(a) == s.fallback;
      EXPECT_TRUE(default_allowed) << s.name << "'s default '" << s.fallback << "' is not among its values";
    }
  }
  EXPECT_EQ(flag_specs().size(), static_cast<size_t>(Flag::Gpt2Dir) + 1);
}

TEST(Flags, TheEnvironmentSetsAValueReadOnFirstUse) {
  EXPECT_EXIT(
      {
        ::setenv("DPT_ATTENTION", "reference", 1);
        ::setenv("DPT_GPT2_DIR", "/somewhere/gpt2", 1);
        const bool ok = flag_value(Flag::Attention) == "reference" && flag_choice(Flag::Attention) == 2 &&
                        flag_value(Flag::Gpt2Dir) == "/somewhere/gpt2";
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Flags, AnUnsetOrEmptyVariableGivesTheDefault) {
  EXPECT_EXIT(
      {
        ::unsetenv("DPT_COMM_STREAM_PRIORITY");
        ::setenv("DPT_LINEAR_FUSED", "", 1);
        const bool ok = flag_value(Flag::CommStreamPriority) == "high" && flag_on(Flag::LinearFused);
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Flags, AValueOutsideTheAllowedOnesIsAnErrorNamingTheVariable) {
  EXPECT_EXIT(
      {
        ::setenv("DPT_ATTENTION", "naive", 1);
        try {
          (void)flag_choice(Flag::Attention);
        } catch (const Error& e) {
          const std::string m = e.what();
          const bool named = m.find("DPT_ATTENTION") != std::string::npos &&
                             m.find("auto, flash, reference") != std::string::npos &&
                             m.find("'naive'") != std::string::npos;
          std::exit(named ? 0 : 2);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Flags, AScopedOverrideWinsAndIsUndoneWhenTheScopeEnds) {
  const std::string before = flag_value(Flag::Attention);
  {
    ScopedFlag outer(Flag::Attention, "flash");
    EXPECT_EQ(flag_value(Flag::Attention), "flash");
    EXPECT_EQ(flag_choice(Flag::Attention), 1);
    {
      ScopedFlag inner(Flag::Attention, "reference");
      EXPECT_EQ(flag_value(Flag::Attention), "reference");
    }
    EXPECT_EQ(flag_value(Flag::Attention), "flash");
  }
  EXPECT_EQ(flag_value(Flag::Attention), before);
  {
    ScopedFlag dir(Flag::Gpt2Dir, "/elsewhere");
    EXPECT_EQ(flag_value(Flag::Gpt2Dir), "/elsewhere");
  }
  EXPECT_NE(flag_value(Flag::Gpt2Dir), "/elsewhere");
}

TEST(Flags, AnOverrideIsValidatedLikeTheEnvironment) {
  try {
    set_flag(Flag::LinearFused, "yes");
    FAIL() << "set_flag accepted 'yes' for an on/off flag";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DPT_LINEAR_FUSED"), std::string::npos) << e.what();
  }
}

TEST(Flags, TheReferenceListsEveryFlagWithItsDefaultAndTheLaunchersVariables) {
  const std::string doc = environment_reference();
  for (const FlagSpec& s : flag_specs()) {
    EXPECT_NE(doc.find(std::string("| `") + s.name + "` |"), std::string::npos) << s.name;
  }
  for (const LauncherVariable& v : launcher_variables()) EXPECT_NE(doc.find(v.name), std::string::npos) << v.name;
  EXPECT_NE(doc.find("| `DPT_ATTENTION` | `auto` | `auto` \\| `flash` \\| `reference` |"), std::string::npos) << doc;
}

}  // namespace
}  // namespace dpt
