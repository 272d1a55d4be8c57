#pragma once

#include <cstddef>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>

#include <c10/util/Exception.h>

namespace mantissa {

/// The spellings of an enum used as a `Choice`: specialise it for each such enum with
/// `static constexpr const char* enum_name` (the Python enum class's name, for messages) and
/// `static constexpr const char* names[]`, one spelling per enumerator in declaration order
/// (the enumerators being 0, 1, 2, ...). See include/mantissa/argument_enums.h.
template <class E>
struct ChoiceTraits;

/// A value of the enum `E` that is read and written by its spelling, as the string enums of
/// Hugging Face (`ExplicitEnum`) are, and compared by its enumerator.
///
///     Choice<SaveStrategy> s = "epoch";            // or SaveStrategy::kEpoch
///     s == SaveStrategy::kEpoch;                   // true
///     switch (s.value()) { case SaveStrategy::kEpoch: ... }
///
/// Comparing with a string (`s == "epoch"`, Python's `args.save_strategy == "epoch"`) does not
/// compile: spellings belong to the edge (command line, JSON), and inside the code an enumerator
/// cannot be misspelt. Use `name()` where the spelling itself is wanted.
///
/// Built from a spelling that `E` does not have, it keeps the text: nothing is checked until
/// `value()` (or `TrainingArguments::validate()`) is asked, so a setter never throws, and the
/// message can name the field and the text. A plain host value; never touches a device.
template <class E>
class Choice {
 public:
  /// The enum this choice holds.
  using enum_type = E;

  /// The choice `value`.
  Choice(E value) : index_(static_cast<int>(value)) {}  // NOLINT(google-explicit-constructor)
  /// The enumerator spelled `name`, or an invalid choice that remembers `name`.
  Choice(std::string_view name) : index_(index_of(name)) {  // NOLINT(google-explicit-constructor)
    if (index_ < 0) unknown_ = std::string(name);
  }
  /// Same as `Choice(std::string_view)`.
  Choice(const char* name)
      : Choice(std::string_view(name)) {}  // NOLINT(google-explicit-constructor)
  /// Same as `Choice(std::string_view)`.
  Choice(const std::string& name)  // NOLINT(google-explicit-constructor)
      : Choice(std::string_view(name)) {}

  /// Whether the spelling named one of `E`'s enumerators.
  bool is_valid() const noexcept { return index_ >= 0; }

  /// The enumerator. Throws `c10::ValueError` in Hugging Face's words for an invalid choice:
  /// "foo is not a valid SchedulerType, please select one of ['linear', 'cosine', ...]".
  E value() const {
    TORCH_CHECK_VALUE(is_valid(), unknown_, " is not a valid ", ChoiceTraits<E>::enum_name,
                      ", please select one of ", choices_text());
    return static_cast<E>(index_);
  }

  /// The spelling: the enumerator's name, or the text an invalid choice was built from.
  std::string_view name() const noexcept {
    return is_valid() ? std::string_view(ChoiceTraits<E>::names[index_])
                      : std::string_view(unknown_);
  }

  /// Every spelling `E` has, in order.
  static constexpr std::size_t size() noexcept { return std::size(ChoiceTraits<E>::names); }
  /// The `i`-th spelling (`i < size()`).
  static constexpr const char* name_at(std::size_t i) noexcept { return ChoiceTraits<E>::names[i]; }

  /// The spellings as a Python list: "['linear', 'cosine']".
  static std::string choices_text() {
    std::string out = "[";
    for (std::size_t i = 0; i < size(); ++i) {
      if (i) out += ", ";
      out += "'";
      out += name_at(i);
      out += "'";
    }
    return out + "]";
  }

  /// The spellings separated by commas, unquoted: "no, steps, epoch".
  static std::string names_text() {
    std::string out;
    for (std::size_t i = 0; i < size(); ++i) {
      if (i) out += ", ";
      out += name_at(i);
    }
    return out;
  }

  friend bool operator==(const Choice& a, const Choice& b) { return a.name() == b.name(); }
  friend bool operator!=(const Choice& a, const Choice& b) { return !(a == b); }
  friend bool operator==(const Choice& a, E b) { return a.index_ == static_cast<int>(b); }
  friend bool operator!=(const Choice& a, E b) { return !(a == b); }
  friend bool operator==(E a, const Choice& b) { return b == a; }
  friend bool operator!=(E a, const Choice& b) { return !(b == a); }
  // Deleted, so that a comparison with a spelling is an error rather than a quiet conversion
  // of the string into a Choice (see the class comment).
  friend bool operator==(const Choice&, const char*) = delete;
  friend bool operator!=(const Choice&, const char*) = delete;
  friend bool operator==(const char*, const Choice&) = delete;
  friend bool operator!=(const char*, const Choice&) = delete;
  friend bool operator==(const Choice&, const std::string&) = delete;
  friend bool operator!=(const Choice&, const std::string&) = delete;
  friend bool operator==(const std::string&, const Choice&) = delete;
  friend bool operator!=(const std::string&, const Choice&) = delete;
  friend bool operator==(const Choice&, std::string_view) = delete;
  friend bool operator!=(const Choice&, std::string_view) = delete;
  friend bool operator==(std::string_view, const Choice&) = delete;
  friend bool operator!=(std::string_view, const Choice&) = delete;

  /// Writes the spelling.
  friend std::ostream& operator<<(std::ostream& out, const Choice& c) { return out << c.name(); }

 private:
  static int index_of(std::string_view name) noexcept {
    for (std::size_t i = 0; i < size(); ++i) {
      if (name == name_at(i)) return static_cast<int>(i);
    }
    return -1;
  }

  int index_;
  std::string unknown_;  // the text of an invalid choice; empty for a valid one
};

}  // namespace mantissa
