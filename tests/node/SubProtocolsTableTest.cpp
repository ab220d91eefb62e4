// The sub-protocol table (node/protocol/SubProtocols.h) is the one place the control messages are
// listed: docs/PROTOCOL.md "Sub-protocols" must list the same ones in the same order, and every
// header the table names must exist. A sub-protocol added in code but not in the docs (or the
// other way round) fails here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "node/protocol/SubProtocols.h"

namespace cairn {
namespace {

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t");
  const auto last = s.find_last_not_of(" \t");
  return first == std::string::npos ? "" : s.substr(first, last - first + 1);
}

// First-column entries of the table under "## Sub-protocols" (header and rule rows skipped).
std::vector<std::string> documentedNames(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> names;
  bool in_section = false;
  int table_rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) {
      if (in_section) break;
      in_section = line == "## Sub-protocols";
      continue;
    }
    if (!in_section || line.empty() || line[0] != '|') continue;
    if (++table_rows <= 2) continue;  // the header row and |---|
    std::stringstream cells(line.substr(1));
    std::string first;
    std::getline(cells, first, '|');
    names.push_back(trim(first));
  }
  return names;
}

TEST(SubProtocols, DocsListTheTableInOrderAndEveryHeaderExists) {
  const std::string source = CAIRN_SOURCE_DIR;
  const auto documented = documentedNames(source + "/docs/PROTOCOL.md");
  std::vector<std::string> table;
  for (const auto& p : subProtocols()) {
    table.push_back(p.name);
    EXPECT_TRUE(std::filesystem::exists(source + "/" + p.header)) << p.name << ": " << p.header;
    EXPECT_GT(std::string(p.description).size(), 0u) << p.name;
  }
  ASSERT_FALSE(table.empty());
  EXPECT_EQ(documented, table) << "docs/PROTOCOL.md \"Sub-protocols\" and subProtocols() differ";
}

}  // namespace
}  // namespace cairn
