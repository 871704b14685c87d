#include "slurm_cluster.hpp"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "drun/common/test_skip.hpp"
#include "process.hpp"

namespace drun::test {

namespace fs = std::filesystem;

SlurmCluster requireSlurmCluster() {
  const char* dir = std::getenv("DRUN_SLURM_DIR");
  SlurmCluster cluster;
  cluster.dir = dir && *dir ? fs::path(dir) : buildDir() / "slurm-cluster";  // as tests/CMakeLists.txt
  if (std::ifstream why(cluster.dir / "unavailable"); why) {
    std::stringstream text;
    text << why.rdbuf();
    std::string reason = text.str();
    while (!reason.empty() && std::isspace(static_cast<unsigned char>(reason.back()))) reason.pop_back();
    skipTest("no SLURM cluster here: " + reason);
  }
  if (!fs::exists(cluster.dir / "up.ok"))
    skipTest("no SLURM cluster is up in " + cluster.dir.string() +
             " (ctest brings it up through the fixture slurm_cluster; by hand: scripts/slurm/up.sh)");
  cluster.conf = (cluster.dir / "etc" / "slurm.conf").string();
  return cluster;
}

std::string slurmTool(const std::string& name) {
  for (const char* d : {"/usr/bin/", "/usr/local/bin/"})
    if (fs::exists(std::string(d) + name)) return std::string(d) + name;
  skipTest("SLURM client program '" + name + "' not found");
}

}  // namespace drun::test
