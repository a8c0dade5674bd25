// Feeds tensors to msprobe's own ATB probe (libatb_probe_abi1.so) exactly as ATB calls it, so that the probe
// writes its ATB dump (statistic.csv, .bin files) on a machine without an NPU.
// stdin, one tensor per line, tab-separated: relpath format dtype dims payload_file offset length
// relpath is the path ATB gives the probe: {dev}_{pid}/{count}/{n}_{Op}/.../{before|after}/{in|out}tensor{k}.bin;
// or an op's parameters: "param" relpath json_file (relpath {dev}_{pid}/{count}/{n}_{Op}/.../op_param.json)
#include <cstdint>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace atb {
class Probe {
public:
    static void UpdateConfig();
    static bool IsSaveTensorInSpecificDir(const std::string &tensorDir);
    static bool IsTensorNeedSave(const std::vector<int64_t> &ids, const std::string &optype);
    static bool IsExecuteCountInRange(const uint64_t executeCount);
    static void SaveTensor(const std::string &format, const std::string &dtype, const std::string &dims,
                           const void *hostData, uint64_t dataSize, const std::string &filePath);
    static bool IsSaveParam();
    static void SaveParam(const std::string &param, const std::string &filePath);
};
}  // namespace atb

int main()
{
    std::string line;
    long saved = 0;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string rel, format, dtype, dims, file, off, len;
        if (line.rfind("param\t", 0) == 0) {
            std::string tag;
            std::getline(in, tag, '\t');
            std::getline(in, rel, '\t');
            std::getline(in, file, '\t');
            std::ifstream f(file);
            std::stringstream body;
            body << f.rdbuf();
            std::vector<int64_t> ids;
            if (!atb::Probe::IsTensorNeedSave(ids, "")) continue;
            atb::Probe::UpdateConfig();
            if (atb::Probe::IsSaveParam()) atb::Probe::SaveParam(body.str(), rel);
            continue;
        }
        if (!std::getline(in, rel, '\t') || !std::getline(in, format, '\t') || !std::getline(in, dtype, '\t') ||
            !std::getline(in, dims, '\t') || !std::getline(in, file, '\t') || !std::getline(in, off, '\t') ||
            !std::getline(in, len, '\t')) {
            std::cerr << "bad line: " << line << std::endl;
            return 2;
        }
        std::vector<char> data(std::stoull(len));
        std::ifstream f(file, std::ios::binary);
        f.seekg(std::stoll(off));
        f.read(data.data(), static_cast<std::streamsize>(data.size()));
        std::vector<int64_t> ids;
        size_t slash1 = rel.find('/');
        size_t slash2 = rel.find('/', slash1 + 1);
        uint64_t count = std::stoull(rel.substr(slash1 + 1, slash2 - slash1 - 1));
        std::string tensorDir = rel.substr(0, rel.rfind('/', rel.rfind('/') - 1));  // the op folder
        if (!atb::Probe::IsTensorNeedSave(ids, "")) continue;
        atb::Probe::UpdateConfig();
        if (!atb::Probe::IsExecuteCountInRange(count) || !atb::Probe::IsSaveTensorInSpecificDir(tensorDir)) continue;
        atb::Probe::SaveTensor(format, dtype, dims, data.data(), data.size(), rel);
        ++saved;
    }
    std::cout << saved << std::endl;
    return 0;
}
