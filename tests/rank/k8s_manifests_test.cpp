// The Kubernetes manifests shipped in scripts/k8s, read as Kubernetes and the Kubeflow
// training operator would: the environment each pod gets (the manifest's own variables
// plus what the operator or the Job controller adds) goes through dtrain run's placement
// and must give every pod its own rank of one world with the store on the first pod;
// the job token comes from a mounted Secret file, the run directory from one shared
// claim, the arguments are valid overrides of the embedded default job, and a failed
// process is restarted.
#include "config/train_config.h"
#include "core/error.h"
#include "rank/external.h"

#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace dtrain;
using Env = std::map<std::string, std::string>;

namespace {

std::string manifest_path(const std::string& name) {
  const char* src = std::getenv("DTRAIN_SOURCE_DIR");
  const std::filesystem::path root = src && *src ? std::filesystem::path(src) : std::filesystem::current_path();
  return (root / "scripts" / "k8s" / name).string();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<YAML::Node> documents(const std::string& name) {
  const std::string path = manifest_path(name);
  REQUIRE_MESSAGE(std::filesystem::exists(path), path << " is missing");
  std::vector<YAML::Node> docs = YAML::LoadAllFromFile(path);
  REQUIRE(!docs.empty());
  return docs;
}

YAML::Node of_kind(const std::vector<YAML::Node>& docs, const std::string& kind) {
  for (const auto& d : docs)
    if (d["kind"] && d["kind"].as<std::string>() == kind) return d;
  FAIL("no " << kind << " in the manifest");
  return {};
}

// What one pod's container says about the job: its argv, the --set overrides, the run
// directory, and the volumes behind its mounts.
struct PodJob {
  std::vector<std::string> argv;
  std::vector<std::string> sets;
  std::map<std::string, std::string> set_values;
  std::string output_dir;
  Env env;                                   // the container's own env entries
  std::map<std::string, YAML::Node> mounts;  // mountPath -> the pod's volume
};

PodJob pod_job(const YAML::Node& pod_spec, const YAML::Node& container) {
  PodJob j;
  for (const auto& a : container["command"]) j.argv.push_back(a.as<std::string>());
  for (const auto& a : container["args"]) j.argv.push_back(a.as<std::string>());
  for (size_t i = 0; i + 1 < j.argv.size(); ++i) {
    if (j.argv[i] == "--set") {
      const std::string kv = j.argv[i + 1];
      j.sets.push_back(kv);
      const size_t eq = kv.find('=');
      REQUIRE(eq != std::string::npos);
      j.set_values[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    if (j.argv[i] == "--output-dir") j.output_dir = j.argv[i + 1];
  }
  if (container["env"])
    for (const auto& e : container["env"]) j.env[e["name"].as<std::string>()] = e["value"].as<std::string>();
  std::map<std::string, YAML::Node> volumes;
  for (const auto& v : pod_spec["volumes"]) volumes[v["name"].as<std::string>()] = static_cast<const YAML::Node&>(v);
  for (const auto& m : container["volumeMounts"]) {
    const std::string name = m["name"].as<std::string>();
    REQUIRE_MESSAGE(volumes.count(name), "volumeMount " << name << " has no volume");
    j.mounts[m["mountPath"].as<std::string>()] = volumes[name];
  }
  return j;
}

// The volume mounted at the deepest mountPath above `path`.
YAML::Node volume_under(const PodJob& j, const std::string& path) {
  YAML::Node best;
  size_t best_len = 0;
  for (const auto& [mount, vol] : j.mounts)
    if (path.rfind(mount + "/", 0) == 0 && mount.size() > best_len) {
      best.reset(vol);
      best_len = mount.size();
    }
  return best;
}

// The checks every pod of either manifest passes.
void check_pod_job(const PodJob& j, const std::string& manifest_text) {
  REQUIRE(j.argv.size() >= 2);
  CHECK(std::filesystem::path(j.argv[0]).filename() == "dtrain");
  CHECK(j.argv[1] == "run");
  // The token from a mounted Secret file, never a value on the command line.
  REQUIRE(j.set_values.count("cluster.rendezvous.token_file"));
  const std::string token_file = j.set_values.at("cluster.rendezvous.token_file");
  const YAML::Node secret = volume_under(j, token_file);
  REQUIRE_MESSAGE(static_cast<bool>(secret && secret["secret"]), token_file << " is not on a Secret volume");
  const std::string key = std::filesystem::path(token_file).filename();
  // The Secret the comment tells the user to create holds the key the file is named after.
  CHECK(manifest_text.find("kubectl create secret generic " + secret["secret"]["secretName"].as<std::string>() +
                           " --from-literal=" + key + "=") != std::string::npos);
  for (const auto& arg : j.argv) CHECK(arg.find("token=") == std::string::npos);
  // The run directory on a shared claim.
  REQUIRE(!j.output_dir.empty());
  const YAML::Node runs = volume_under(j, j.output_dir);
  REQUIRE_MESSAGE(static_cast<bool>(runs && runs["persistentVolumeClaim"]),
                  j.output_dir << " is not on a PersistentVolumeClaim");
  // The overrides are valid for the embedded default job and leave the token to the file.
  config::LoadedConfig loaded =
      config::config_load_string(config::kDefaultConfigYaml, "<embedded default>", j.sets, config::kDefaultConfigDir);
  CHECK(loaded.cfg.cluster.rendezvous.token_file == token_file);
  CHECK(loaded.cfg.cluster.rendezvous.token_env.empty());
  CHECK(loaded.cfg.fault_tolerance.heartbeat_timeout > 0);
}

}  // namespace

TEST_CASE("scripts/k8s/pytorchjob.yaml: the operator's variables give every pod its rank; token, run dir, restarts") {
  const std::vector<YAML::Node> docs = documents("pytorchjob.yaml");
  const std::string text = read_text(manifest_path("pytorchjob.yaml"));
  const YAML::Node job = of_kind(docs, "PyTorchJob");
  CHECK(job["apiVersion"].as<std::string>() == "kubeflow.org/v1");
  const std::string name = job["metadata"]["name"].as<std::string>();
  const YAML::Node specs = job["spec"]["pytorchReplicaSpecs"];
  REQUIRE(specs["Master"].IsDefined());
  REQUIRE(specs["Worker"].IsDefined());
  REQUIRE(specs["Master"]["replicas"].as<int>() == 1);
  const int workers = specs["Worker"]["replicas"].as<int>();
  const int world = 1 + workers;
  CHECK(job["spec"]["runPolicy"]["backoffLimit"].as<int>() > 0);

  // The operator's environment per pod (training-operator v1): MASTER_ADDR the master
  // pod's Service, MASTER_PORT the container port named pytorchjob-port, WORLD_SIZE the
  // pod count, RANK 0 for the master and 1 + index for worker <index>.
  std::set<int> ranks;
  std::set<std::string> claims;
  std::set<std::vector<std::string>> argvs;
  for (const std::string type : {"Master", "Worker"}) {
    const YAML::Node spec = specs[type];
    const std::string policy = spec["restartPolicy"].as<std::string>();
    CHECK((policy == "OnFailure" || policy == "ExitCode" || policy == "Always"));
    const YAML::Node pod = spec["template"]["spec"];
    YAML::Node container;
    bool found = false;
    for (const auto& c : pod["containers"])
      if (c["name"].as<std::string>() == "pytorch") {
        container.reset(c);
        found = true;
      }
    REQUIRE_MESSAGE(found, type << ": the operator needs a container named pytorch");
    int port = 0;
    for (const auto& p : container["ports"])
      if (p["name"].as<std::string>() == "pytorchjob-port") port = p["containerPort"].as<int>();
    REQUIRE_MESSAGE(port > 0, type << ": no container port named pytorchjob-port (the operator's MASTER_PORT)");
    const PodJob j = pod_job(pod, container);
    check_pod_job(j, text);
    claims.insert(volume_under(j, j.output_dir)["persistentVolumeClaim"]["claimName"].as<std::string>());
    argvs.insert(j.argv);
    for (int i = 0; i < spec["replicas"].as<int>(); ++i) {
      Env env = j.env;
      env["MASTER_ADDR"] = name + "-master-0";
      env["MASTER_PORT"] = std::to_string(port);
      env["WORLD_SIZE"] = std::to_string(world);
      env["RANK"] = std::to_string(type == "Master" ? 0 : 1 + i);
      const rank::ExternalPlacement p = rank::external_placement(env);
      CHECK(p.launcher == "torchrun");
      CHECK(p.world_size == world);
      CHECK(p.master_addr == name + "-master-0");
      CHECK(p.master_port == port);
      CHECK(p.local_world_size == 1);
      ranks.insert(p.rank);
    }
  }
  CHECK(ranks.size() == static_cast<size_t>(world));
  CHECK(*ranks.begin() == 0);
  CHECK(*ranks.rbegin() == world - 1);
  CHECK(claims.size() == 1);  // one run directory for all
  CHECK(argvs.size() == 1);   // the same job everywhere
}

TEST_CASE("scripts/k8s/indexed-job.yaml: the pod index is the rank, pod 0's DNS name the store; token, run dir") {
  const std::vector<YAML::Node> docs = documents("indexed-job.yaml");
  const std::string text = read_text(manifest_path("indexed-job.yaml"));
  const YAML::Node service = of_kind(docs, "Service");
  const YAML::Node job = of_kind(docs, "Job");
  const std::string svc = service["metadata"]["name"].as<std::string>();
  const std::string name = job["metadata"]["name"].as<std::string>();
  CHECK(service["spec"]["clusterIP"].as<std::string>() == "None");  // headless: per-pod DNS records
  CHECK(service["spec"]["selector"]["job-name"].as<std::string>() == name);

  const YAML::Node spec = job["spec"];
  CHECK(spec["completionMode"].as<std::string>() == "Indexed");
  const int completions = spec["completions"].as<int>();
  CHECK(spec["parallelism"].as<int>() == completions);  // every rank runs at once
  CHECK(spec["backoffLimit"].as<int>() > 0);
  const YAML::Node pod = spec["template"]["spec"];
  CHECK(pod["subdomain"].as<std::string>() == svc);
  REQUIRE(pod["containers"].size() == 1);
  const PodJob j = pod_job(pod, pod["containers"][0]);
  check_pod_job(j, text);

  // Kubernetes names pod i <job>-<i> and, with the subdomain, resolves
  // <job>-<i>.<service>; the store is pod 0's, on a port the Service exposes.
  REQUIRE(j.env.count("MASTER_ADDR"));
  REQUIRE(j.env.count("MASTER_PORT"));
  CHECK(j.env.at("MASTER_ADDR") == name + "-0." + svc);
  bool exposed = false;
  for (const auto& p : service["spec"]["ports"])
    exposed = exposed || std::to_string(p["port"].as<int>()) == j.env.at("MASTER_PORT");
  CHECK(exposed);
  std::set<int> ranks;
  for (int i = 0; i < completions; ++i) {
    Env env = j.env;
    env["JOB_COMPLETION_INDEX"] = std::to_string(i);  // set by the Job controller
    const rank::ExternalPlacement p = rank::external_placement(env);
    CHECK(p.launcher == "a Kubernetes Indexed Job");
    CHECK(p.rank == i);
    CHECK(p.world_size == completions);
    CHECK(p.master_addr == name + "-0." + svc);
    CHECK(std::to_string(p.master_port) == j.env.at("MASTER_PORT"));
    ranks.insert(p.rank);
  }
  CHECK(ranks.size() == static_cast<size_t>(completions));
}
