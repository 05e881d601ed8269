// The fake shell's parser: a recursive descent over the script's text with
// one token of lookahead, the shell grammar's usual shape (list, and-or,
// pipeline, command), and its arithmetic. Command substitutions are parsed
// in place by a nested parser, so a script's syntax errors all show before
// anything runs. Messages follow dash's ("syntax error: ... unexpected").
#include <cctype>
#include <cstdlib>

#include "drivers/fake/fake_shell_internal.hpp"

namespace dsec::drivers::fakesh {

namespace {

bool IsNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsMeta(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == ';' || c == '&' || c == '|' || c == '(' || c == ')' || c == '<' ||
         c == '>';
}
bool IsName(const std::string& s) {
  if (s.empty() || !IsNameStart(s[0])) return false;
  for (char c : s)
    if (!IsNameChar(c)) return false;
  return true;
}

void AddLit(Word* w, char c, bool quoted) {
  if (w->parts.empty() || w->parts.back().kind != WordPart::kLit || w->parts.back().quoted != quoted) {
    WordPart p;
    p.quoted = quoted;
    w->parts.push_back(p);
  }
  w->parts.back().text.push_back(c);
}

class Parser {
 public:
  Parser(const std::string& src, size_t pos) : src_(src), pos_(pos) {}

  NodePtr Program() {
    auto list = List();
    if (ok() && Peek().kind != Tok::kEof) Unexpected();
    return ok() ? list : nullptr;
  }
  // The rest of the text as the inside of double quotes.
  Word QuotedText() {
    Word w;
    WordPart empty;
    empty.quoted = true;
    w.parts.push_back(empty);
    while (ok() && pos_ < src_.size()) {
      char c = src_[pos_];
      if (c == '$')
        Dollar(&w, true);
      else if (c == '`')
        Backquote(&w, true);
      else if (c == '\\' && pos_ + 1 < src_.size() && std::string("$`\"\\").find(src_[pos_ + 1]) != std::string::npos) {
        AddLit(&w, src_[pos_ + 1], true);
        pos_ += 2;
      } else {
        AddLit(&w, c, true);
        ++pos_;
      }
    }
    return w;
  }
  // A command substitution's list, up to its ')'.
  NodePtr Substitution() {
    auto list = List();
    if (ok() && !IsOp(")")) Expect(")");
    if (ok()) Take();
    return ok() ? list : nullptr;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t pos() const { return pos_; }

 private:
  struct Tok {
    enum Kind { kWord, kOp, kIoNum, kEof };
    Kind kind = kEof;
    std::string op;
    Word word;
    int fd = -1;
  };

  void Fail(const std::string& what) {
    if (error_.empty()) error_ = "syntax error: " + what;
  }
  std::string Describe(const Tok& t) {
    std::string w;
    if (t.kind == Tok::kEof) return "end of file";
    if (t.kind == Tok::kOp) return t.op == "\n" ? "newline" : "\"" + t.op + "\"";
    if (t.kind == Tok::kIoNum) return "\"" + std::to_string(t.fd) + "\"";
    return t.word.Plain(&w) ? "\"" + w + "\"" : "word";
  }
  void Unexpected() { Fail(Describe(Peek()) + " unexpected"); }
  void Expect(const std::string& what) { Fail(Describe(Peek()) + " unexpected (expecting \"" + what + "\")"); }

  // --- the lexer ---------------------------------------------------------------
  const Tok& Peek() {
    if (!have_) {
      tok_ = Lex();
      have_ = true;
    }
    return tok_;
  }
  Tok Take() {
    Peek();
    have_ = false;
    return std::move(tok_);
  }
  bool IsOp(const char* op) { return Peek().kind == Tok::kOp && Peek().op == op; }
  bool IsWord(const char* w) {
    std::string text;
    return Peek().kind == Tok::kWord && Peek().word.Plain(&text) && text == w;
  }
  void SkipNewlines() {
    while (ok() && IsOp("\n")) Take();
  }

  Tok Lex() {
    Tok t;
    for (;;) {  // blanks, line continuations, comments
      if (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t'))
        ++pos_;
      else if (src_.compare(pos_, 2, "\\\n") == 0)
        pos_ += 2;
      else if (pos_ < src_.size() && src_[pos_] == '#')
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      else
        break;
    }
    if (pos_ >= src_.size() || !ok()) return t;
    char c = src_[pos_];
    if (IsMeta(c)) {
      t.kind = Tok::kOp;
      static const char* kOps[] = {"&&", "||", ";;", ">>", ">&", "<&", ">|", "<<",
                                   "\n", ";",  "&",  "|",  "(",  ")",  "<",  ">"};
      for (const char* op : kOps)
        if (src_.compare(pos_, std::char_traits<char>::length(op), op) == 0) {
          t.op = op;
          break;
        }
      pos_ += t.op.size();
      if (t.op == ">|") t.op = ">";
      if (t.op == "<<") Fail("here-documents (<<) are not supported by the fake shell");
      return t;
    }
    t.kind = Tok::kWord;
    t.word = ReadWord();
    std::string text;
    if (t.word.Plain(&text) && text.size() < 3 && pos_ < src_.size() && (src_[pos_] == '<' || src_[pos_] == '>') &&
        text.find_first_not_of("0123456789") == std::string::npos) {
      t.kind = Tok::kIoNum;
      t.fd = std::atoi(text.c_str());
    }
    return t;
  }

  Word ReadWord() {
    Word w;
    while (ok() && pos_ < src_.size() && !IsMeta(src_[pos_])) {
      char c = src_[pos_];
      if (c == '\\') {
        if (pos_ + 1 >= src_.size()) {
          AddLit(&w, '\\', false);
          ++pos_;
        } else if (src_[pos_ + 1] == '\n') {
          pos_ += 2;
        } else {
          AddLit(&w, src_[pos_ + 1], true);
          pos_ += 2;
        }
      } else if (c == '\'') {
        size_t end = src_.find('\'', pos_ + 1);
        if (end == std::string::npos) return Fail("unterminated quoted string"), w;
        WordPart p;
        p.quoted = true;
        p.text = src_.substr(pos_ + 1, end - pos_ - 1);
        w.parts.push_back(p);
        pos_ = end + 1;
      } else if (c == '"') {
        ReadDouble(&w);
      } else if (c == '$') {
        Dollar(&w, false);
      } else if (c == '`') {
        Backquote(&w, false);
      } else {
        AddLit(&w, c, false);
        ++pos_;
      }
    }
    return w;
  }

  void ReadDouble(Word* w) {
    ++pos_;
    WordPart empty;  // "" is a field of its own, even empty
    empty.quoted = true;
    w->parts.push_back(empty);
    for (;;) {
      if (!ok()) return;
      if (pos_ >= src_.size()) return Fail("unterminated quoted string");
      char c = src_[pos_];
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c == '\\' && pos_ + 1 < src_.size() && std::string("$`\"\\\n").find(src_[pos_ + 1]) != std::string::npos) {
        if (src_[pos_ + 1] != '\n') AddLit(w, src_[pos_ + 1], true);
        pos_ += 2;
      } else if (c == '$') {
        Dollar(w, true);
      } else if (c == '`') {
        Backquote(w, true);
      } else {
        AddLit(w, c, true);
        ++pos_;
      }
    }
  }

  void Dollar(Word* w, bool quoted) {
    WordPart p;
    p.quoted = quoted;
    char n = pos_ + 1 < src_.size() ? src_[pos_ + 1] : '\0';
    if (n == '(' && pos_ + 2 < src_.size() && src_[pos_ + 2] == '(') {
      int depth = 2;
      size_t i = pos_ + 3;
      for (; i < src_.size() && depth > 0; ++i) depth += src_[i] == '(' ? 1 : src_[i] == ')' ? -1 : 0;
      if (depth > 0) return Fail("unterminated $((");
      p.kind = WordPart::kArith;
      p.text = src_.substr(pos_ + 3, i - 2 - (pos_ + 3));
      pos_ = i;
    } else if (n == '(') {
      Parser sub(src_, pos_ + 2);
      sub.depth_ = depth_ + 1;
      if (sub.depth_ > 64) return Fail("command substitutions nested too deep");
      p.kind = WordPart::kCmd;
      p.cmd = sub.Substitution();
      if (!sub.ok()) return Fail(sub.error_.substr(14));
      pos_ = sub.pos_;
    } else if (n == '{') {
      size_t end = src_.find('}', pos_ + 2);
      if (end == std::string::npos) return Fail("missing '}' after ${");
      std::string in = src_.substr(pos_ + 2, end - pos_ - 2);
      pos_ = end + 1;
      p.kind = WordPart::kParam;
      if (in.size() > 1 && in[0] == '#') {
        p.length = true;
        in = in.substr(1);
      }
      size_t len = 0;
      if (!in.empty() && std::string("?#$!@*-0123456789").find(in[0]) != std::string::npos)
        len = 1;
      else
        while (len < in.size() && IsNameChar(in[len])) ++len;
      p.text = in.substr(0, len);
      std::string rest = in.substr(len);
      if (rest.compare(0, 2, ":-") == 0 || (!rest.empty() && rest[0] == '-')) {
        p.has_alt = true;
        p.alt_if_empty = rest[0] == ':';
        p.alt = rest.substr(p.alt_if_empty ? 2 : 1);
      } else if (!rest.empty() || p.text.empty()) {
        return Fail("${" + in + "}: bad substitution");
      }
    } else if (IsNameStart(n)) {
      size_t i = pos_ + 1;
      while (i < src_.size() && IsNameChar(src_[i])) ++i;
      p.kind = WordPart::kParam;
      p.text = src_.substr(pos_ + 1, i - pos_ - 1);
      pos_ = i;
    } else if (n != '\0' && std::string("?#$!@*-0123456789").find(n) != std::string::npos) {
      p.kind = WordPart::kParam;
      p.text = std::string(1, n);
      pos_ += 2;
    } else {
      AddLit(w, '$', quoted);
      ++pos_;
      return;
    }
    w->parts.push_back(std::move(p));
  }

  void Backquote(Word* w, bool quoted) {
    std::string inner;
    size_t i = pos_ + 1;
    for (; i < src_.size() && src_[i] != '`'; ++i) {
      if (src_[i] == '\\' && i + 1 < src_.size() && std::string("$`\\").find(src_[i + 1]) != std::string::npos) ++i;
      inner.push_back(src_[i]);
    }
    if (i >= src_.size()) return Fail("unterminated `");
    pos_ = i + 1;
    auto tree = Parse(inner);
    if (!tree.ok()) return Fail(tree.status().message().substr(14));
    WordPart p;
    p.kind = WordPart::kCmd;
    p.quoted = quoted;
    p.cmd = *tree;
    w->parts.push_back(std::move(p));
  }

  // --- the grammar ---------------------------------------------------------------
  bool AtListEnd() {
    const Tok& t = Peek();
    if (t.kind == Tok::kEof || (t.kind == Tok::kOp && t.op == ")")) return true;
    for (const char* w : {"then", "else", "elif", "fi", "do", "done", "}"})
      if (IsWord(w)) return true;
    return false;
  }

  NodePtr List() {
    auto n = std::make_shared<Node>();
    n->kind = Node::kList;
    SkipNewlines();
    while (ok() && !AtListEnd()) {
      auto item = AndOr();
      if (!ok()) break;
      int bg = 0;
      if (IsOp("&")) {
        Take();
        bg = 1;
      } else if (IsOp(";") || IsOp("\n")) {
        Take();
      } else if (!AtListEnd()) {
        Unexpected();
        break;
      }
      n->kids.push_back(item);
      n->flags.push_back(bg);
      SkipNewlines();
    }
    return n;
  }
  NodePtr NonEmptyList() {
    auto n = List();
    if (ok() && n->kids.empty()) Unexpected();
    return n;
  }

  NodePtr AndOr() {
    auto first = Pipeline();
    if (!ok() || !(IsOp("&&") || IsOp("||"))) return first;
    auto n = std::make_shared<Node>();
    n->kind = Node::kAndOr;
    n->kids.push_back(first);
    while (ok() && (IsOp("&&") || IsOp("||"))) {
      n->flags.push_back(Take().op == "&&" ? 1 : 2);
      SkipNewlines();
      n->kids.push_back(Pipeline());
    }
    return n;
  }

  NodePtr Pipeline() {
    bool negate = false;
    if (IsWord("!")) {
      Take();
      negate = true;
    }
    auto first = Command();
    if (!ok() || (!negate && !IsOp("|"))) return first;
    auto n = std::make_shared<Node>();
    n->kind = Node::kPipeline;
    n->negate = negate;
    n->kids.push_back(first);
    while (ok() && IsOp("|")) {
      Take();
      SkipNewlines();
      n->kids.push_back(Command());
    }
    return n;
  }

  NodePtr Command() {
    std::shared_ptr<Node> n;
    if (IsOp("(")) {
      Take();
      n = Compound(Node::kSubshell, {NonEmptyList()});
      if (ok() && !IsOp(")")) Expect(")");
      if (ok()) Take();
    } else if (IsWord("{")) {
      Take();
      n = Compound(Node::kGroup, {NonEmptyList()});
      if (ok()) ExpectWord("}");
    } else if (IsWord("if")) {
      n = If();
    } else if (IsWord("while") || IsWord("until")) {
      bool until = IsWord("until");
      Take();
      auto cond = NonEmptyList();
      if (ok()) ExpectWord("do");
      auto body = ok() ? NonEmptyList() : nullptr;
      if (ok()) ExpectWord("done");
      n = Compound(until ? Node::kUntil : Node::kWhile, {cond, body});
    } else if (IsWord("for")) {
      n = For();
    } else {
      return Simple();
    }
    while (ok() && (Peek().kind == Tok::kIoNum || IsRedirOp())) Redirection(n.get());
    return n;
  }

  std::shared_ptr<Node> Compound(Node::Kind kind, std::vector<NodePtr> kids) {
    auto n = std::make_shared<Node>();
    n->kind = kind;
    n->kids = std::move(kids);
    return n;
  }
  void ExpectWord(const char* w) {
    if (!IsWord(w)) return Expect(w);
    Take();
  }

  std::shared_ptr<Node> If() {
    Take();
    auto n = Compound(Node::kIf, {});
    for (;;) {
      n->kids.push_back(NonEmptyList());
      if (ok()) ExpectWord("then");
      if (ok()) n->kids.push_back(NonEmptyList());
      if (!ok()) return n;
      if (IsWord("elif")) {
        Take();
        continue;
      }
      if (IsWord("else")) {
        Take();
        n->kids.push_back(NonEmptyList());
      }
      if (ok()) ExpectWord("fi");
      return n;
    }
  }

  std::shared_ptr<Node> For() {
    Take();
    auto n = Compound(Node::kFor, {});
    Tok name = Take();
    if (name.kind != Tok::kWord || !name.word.Plain(&n->var) || !IsName(n->var)) {
      Fail("bad for loop variable");
      return n;
    }
    SkipNewlines();
    if (IsWord("in")) {
      Take();
      n->has_items = true;
      while (ok() && Peek().kind == Tok::kWord) n->items.push_back(Take().word);
      if (ok() && !IsOp(";") && !IsOp("\n")) return Expect("do"), n;
      if (ok()) Take();
    } else if (IsOp(";")) {
      Take();
    }
    SkipNewlines();
    if (ok()) ExpectWord("do");
    if (ok()) n->kids.push_back(NonEmptyList());
    if (ok()) ExpectWord("done");
    return n;
  }

  bool IsRedirOp() {
    for (const char* op : {"<", ">", ">>", ">&", "<&"})
      if (IsOp(op)) return true;
    return false;
  }

  void Redirection(Node* n) {
    Redir r;
    int fd = -1;
    if (Peek().kind == Tok::kIoNum) fd = Take().fd;
    std::string op = Take().op;
    r.op = op == "<" ? Redir::kIn : op == ">" ? Redir::kOut : op == ">>" ? Redir::kAppend : Redir::kDup;
    r.fd = fd >= 0 ? fd : (op[0] == '<' ? 0 : 1);
    if (Peek().kind != Tok::kWord) return Expect("a file name after " + op);
    r.target = Take().word;
    n->redirs.push_back(std::move(r));
  }

  NodePtr Simple() {
    auto n = std::make_shared<Node>();
    n->kind = Node::kSimple;
    for (;;) {
      if (!ok()) return n;
      if (Peek().kind == Tok::kIoNum || IsRedirOp()) {
        Redirection(n.get());
        continue;
      }
      if (Peek().kind != Tok::kWord) break;
      Word w = Take().word;
      std::string name;
      const WordPart* first = w.parts.empty() ? nullptr : &w.parts[0];
      size_t eq = first && first->kind == WordPart::kLit && !first->quoted ? first->text.find('=') : std::string::npos;
      if (n->words.empty() && eq != std::string::npos && IsName(first->text.substr(0, eq))) {
        Word value;
        value.parts.assign(w.parts.begin() + 1, w.parts.end());
        if (eq + 1 < first->text.size()) {
          WordPart rest = *first;
          rest.text = first->text.substr(eq + 1);
          value.parts.insert(value.parts.begin(), rest);
        }
        n->assigns.emplace_back(first->text.substr(0, eq), std::move(value));
      } else {
        n->words.push_back(std::move(w));
      }
    }
    if (n->words.empty() && n->assigns.empty() && n->redirs.empty()) Unexpected();
    return n;
  }

  const std::string& src_;
  size_t pos_;
  int depth_ = 0;
  bool have_ = false;
  Tok tok_;
  std::string error_;
};

// --- arithmetic ------------------------------------------------------------------

class Arith {
 public:
  Arith(const std::string& e, const std::function<std::string(const std::string&)>& value) : e_(e), value_(value) {}
  bool Run(int64_t* out, std::string* err) {
    *out = Binary(0);
    Blank();
    if (error_.empty() && i_ < e_.size()) error_ = "syntax error";
    if (!error_.empty()) *err = "arithmetic expression: " + error_ + ": \"" + e_ + "\"";
    return error_.empty();
  }

 private:
  void Blank() {
    while (i_ < e_.size() && std::isspace(static_cast<unsigned char>(e_[i_]))) ++i_;
  }
  bool Eat(const char* op) {
    Blank();
    size_t n = std::char_traits<char>::length(op);
    if (e_.compare(i_, n, op) != 0) return false;
    i_ += n;
    return true;
  }
  int64_t Number(const std::string& text) {
    if (text.empty()) return 0;
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 0);
    if (*end) error_ = "Illegal number: " + text;
    return v;
  }
  int64_t Primary() {
    Blank();
    if (Eat("(")) {
      int64_t v = Binary(0);
      if (!Eat(")")) error_ = "missing )";
      return v;
    }
    if (Eat("-")) return -Primary();
    if (Eat("+")) return Primary();
    if (Eat("!")) return !Primary();
    if (Eat("~")) return ~Primary();
    size_t start = i_;
    if (i_ < e_.size() && e_[i_] == '$') ++i_;
    bool brace = i_ < e_.size() && e_[i_] == '{';
    if (brace) ++i_;
    size_t name = i_;
    while (i_ < e_.size() &&
           (IsNameChar(e_[i_]) || (i_ == name && std::string("?#").find(e_[i_]) != std::string::npos)))
      ++i_;
    std::string tok = e_.substr(name, i_ - name);
    if (brace && (i_ >= e_.size() || e_[i_++] != '}')) error_ = "missing }";
    if (tok.empty()) {
      error_ = i_ >= e_.size() ? "expression expected" : std::string("unexpected '") + e_[i_] + "'";
      return 0;
    }
    if (std::isdigit(static_cast<unsigned char>(tok[0])) && e_[start] != '$') return Number(tok);
    return Number(value_(tok));
  }
  static int Prec(const std::string& op) {
    if (op == "||") return 1;
    if (op == "&&") return 2;
    if (op == "==" || op == "!=") return 3;
    if (op == "<" || op == "<=" || op == ">" || op == ">=") return 4;
    if (op == "+" || op == "-") return 5;
    return 6;  // * / %
  }
  int64_t Binary(int min) {
    int64_t left = Primary();
    while (error_.empty()) {
      std::string op;
      for (const char* o : {"||", "&&", "==", "!=", "<=", ">=", "<", ">", "+", "-", "*", "/", "%"}) {
        size_t save = i_;
        if (Eat(o)) {
          op = o;
          i_ = save;
          break;
        }
      }
      if (op.empty() || Prec(op) <= min) break;
      Eat(op.c_str());
      int64_t right = Binary(Prec(op));
      if ((op == "/" || op == "%") && right == 0) {
        error_ = "division by zero";
        return 0;
      }
      left = op == "||"   ? (left || right)
             : op == "&&" ? (left && right)
             : op == "==" ? left == right
             : op == "!=" ? left != right
             : op == "<"  ? left < right
             : op == "<=" ? left <= right
             : op == ">"  ? left > right
             : op == ">=" ? left >= right
             : op == "+"  ? left + right
             : op == "-"  ? left - right
             : op == "*"  ? left * right
             : op == "/"  ? left / right
                          : left % right;
    }
    return left;
  }

  const std::string& e_;
  const std::function<std::string(const std::string&)>& value_;
  size_t i_ = 0;
  std::string error_;
};

}  // namespace

bool Word::Plain(std::string* text) const {
  if (parts.size() != 1 || parts[0].kind != WordPart::kLit || parts[0].quoted) return false;
  if (text) *text = parts[0].text;
  return true;
}

Result<NodePtr> Parse(const std::string& script) {
  Parser p(script, 0);
  auto tree = p.Program();
  if (!p.ok()) return Status::InvalidArgument(p.error());
  return tree;
}

Result<Word> ParseQuotedText(const std::string& text) {
  Parser p(text, 0);
  Word w = p.QuotedText();
  if (!p.ok()) return Status::InvalidArgument(p.error());
  return w;
}

bool EvalArith(const std::string& expr, const std::function<std::string(const std::string&)>& value, int64_t* out,
               std::string* err) {
  return Arith(expr, value).Run(out, err);
}

}  // namespace dsec::drivers::fakesh
