#include "pipeline.h"

#include "engine_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace dsa
{

namespace
{

char const* const kPipelineFormat = "dsa-export-pipeline";
int const kPipelineVersion = 1;  // manifest.PIPELINE_VERSION
int const kSchemaVersion = 1;    // manifest.SCHEMA_VERSION
char const* const kRebuild = "build the stages again with `dsa-export build`";

std::string stageFolderName(int index)
{
    std::string digits = std::to_string(index);
    return "stage_" + std::string(digits.size() < 2 ? 2 - digits.size() : 0, '0') + digits;
}

std::string shown(Json const& value)
{
    switch (value.type)
    {
    case Json::Type::kNull: return "null";
    case Json::Type::kBool: return value.boolean ? "true" : "false";
    case Json::Type::kNumber:
    {
        std::ostringstream out;
        out << value.number;
        return out.str();
    }
    case Json::Type::kString: return "'" + value.string + "'";
    case Json::Type::kArray: return "a list";
    case Json::Type::kObject: return "an object";
    }
    return "?";
}

[[noreturn]] void fieldError(std::string const& where, std::string const& field, Json const& value, std::string const& wanted,
    std::string const& fix)
{
    throw UserError(where + " has an invalid field " + field + " (" + shown(value) + ", not " + wanted + "); " + fix + ".");
}

int64_t integer(Json const& value, std::string const& where, std::string const& field, std::string const& fix)
{
    if (!value.isInteger())
    {
        fieldError(where, field, value, "an integer", fix);
    }
    return static_cast<int64_t>(value.number);
}

//! ``root``/``relative``, refusing absolute paths and paths (or links) that lead out of ``root``
//! (as manifest.confined).
std::string confined(std::string const& root, std::string const& relative, std::string const& what, std::string const& fix)
{
    if (relative.empty() || relative.find('\0') != std::string::npos)
    {
        throw UserError(what + " is empty, not a file name; " + fix + ".");
    }
    fs::path const rel(relative);
    if (rel.is_absolute() || rel.has_root_name())
    {
        throw UserError(what + " is the absolute path '" + relative + "', but it must lie inside " + root + "; " + fix + ".");
    }
    std::error_code error;
    std::error_code fullError;
    fs::path const base = fs::weakly_canonical(fs::path(root), error);
    fs::path const full = fs::weakly_canonical(fs::path(root) / rel, fullError);
    if (error || fullError)
    {
        throw UserError(what + " is '" + relative + "', which cannot be resolved (" + (error ? error : fullError).message() + "); " + fix + ".");
    }
    auto const mismatch = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
    if (mismatch.first != base.end() || full == base)
    {
        throw UserError(what + " is '" + relative + "', which leads out of " + root + "; " + fix + ".");
    }
    return (fs::path(root) / rel).lexically_normal().string();
}

//! One tensor of a manifest's ``inputs`` or ``outputs`` (``at``: "inputs[3]").
TensorSpec readSpec(Json const& item, std::string const& where, std::string const& at)
{
    if (!item["name"].isString() || item["name"].string.empty())
    {
        fieldError(where, at, item, "a tensor with a name", kRebuild);
    }
    if (!item["dtype"].isString())
    {
        fieldError(where, at + ".dtype", item["dtype"], "a dtype name", kRebuild);
    }
    TensorSpec spec;
    spec.name = item["name"].string;
    spec.dtype = item["dtype"].string;
    Json const& shape = item["shape"];
    if (!shape.isNull() && !shape.isArray())
    {
        fieldError(where, at + ".shape", shape, "a list of sizes and dim names", kRebuild);
    }
    for (Json const& d : shape.array)
    {
        Dim dim;
        if (d.isString() && !d.string.empty())
        {
            dim.name = d.string;
        }
        else if (d.isInteger() && d.number >= 0)
        {
            dim.size = static_cast<int64_t>(d.number);
        }
        else
        {
            fieldError(where, at + ".shape", shape, "a list of sizes and dim names", kRebuild);
        }
        spec.shape.push_back(dim);
    }
    Json const& range = item["value_range"];
    if (!range.isNull())
    {
        if (!(range.isArray() && range.array.size() == 2 && range.array[0].isInteger() && range.array[1].isInteger()
                && range.array[0].number < range.array[1].number))
        {
            fieldError(where, at + ".value_range", range, "[low, high) integers", kRebuild);
        }
        spec.hasValueRange = true;
        spec.low = static_cast<int64_t>(range.array[0].number);
        spec.high = static_cast<int64_t>(range.array[1].number);
    }
    return spec;
}

std::vector<TensorSpec> readSpecs(Json const& list, std::string const& where, std::string const& field)
{
    std::vector<TensorSpec> specs;
    if (list.isNull())
    {
        return specs;
    }
    if (!list.isArray())
    {
        fieldError(where, field, list, "a list of tensors", kRebuild);
    }
    for (size_t i = 0; i < list.array.size(); ++i)
    {
        specs.push_back(readSpec(list.array[i], where, field + "[" + std::to_string(i) + "]"));
    }
    return specs;
}

Json readJsonFile(std::string const& path, std::string const& fix)
{
    if (!isFile(path))
    {
        throw UserError(path + " does not exist; " + fix + ".");
    }
    Json data = parseJson(readText(path), path);
    if (!data.isObject())
    {
        throw UserError(path + " is not a JSON object; " + fix + ".");
    }
    return data;
}

//! The manifest.json of ``stage`` (labelled for the errors), checked to be a dsa-export manifest
//! of a schema this program reads.
Json readManifestFile(Stage const& stage, std::string const& manifestPath)
{
    if (!isFile(manifestPath))
    {
        throw UserError(stage.label + ": " + manifestPath + " does not exist, so its engine is unknown; " + kRebuild + ".");
    }
    Json data = parseJson(readText(manifestPath), manifestPath);
    if (!data.isObject() || !data["schema_version"].isInteger())
    {
        throw UserError(manifestPath + " is not a dsa-export manifest (no schema_version); " + kRebuild + ".");
    }
    if (data["schema_version"].number > kSchemaVersion)
    {
        throw UserError(manifestPath + " has manifest schema " + shown(data["schema_version"])
            + ", newer than this program reads (" + std::to_string(kSchemaVersion) + "); update tools/cpp_runtime.");
    }
    return data;
}

//! The manifest's "engine" section into ``stage.engine``: all but the engine file.
void readEngineInfo(Stage& stage, Json const& engine, std::string const& manifestPath)
{
    EngineInfo& info = stage.engine;
    info.backend = engine["backend"].isString() ? engine["backend"].string : "tensorrt";
    if (info.backend != "tensorrt")
    {
        throw UserError(stage.label + ": the engine was built for " + info.backend
            + "; this program links TensorRT (build it against TensorRT-RTX's headers and library for RTX engines).");
    }
    if (!engine["trt_version"].isString() || parseVersion(engine["trt_version"].string).empty())
    {
        throw UserError(manifestPath + " has no valid \"trt_version\", so the engine cannot be checked; " + kRebuild + ".");
    }
    info.trtVersion = engine["trt_version"].string;
    info.versionCompatible = engine["version_compatible"].type == Json::Type::kBool && engine["version_compatible"].boolean;
    if (engine["hardware_compatibility"].isString())
    {
        info.hardwareCompatibility = engine["hardware_compatibility"].string;
    }
    Json const& capability = engine["compute_capability"];
    if (capability.isString())
    {
        info.computeCapability.push_back(capability.string);
    }
    for (Json const& cc : capability.array)
    {
        if (cc.isString())
        {
            info.computeCapability.push_back(cc.string);
        }
    }
    if (engine["plugin_library_sha256"].isString())
    {
        info.pluginLibrarySha256 = engine["plugin_library_sha256"].string;
    }
    if (engine["plugin_library"].isString())
    {
        info.pluginLibrary = engine["plugin_library"].string;
    }
    // As engine_gate.EngineRequirements: only version-compatible plans carry serialized libraries.
    info.pluginsSerialized = engine["plugins_serialized"].type == Json::Type::kBool && engine["plugins_serialized"].boolean
        && !info.pluginLibrarySha256.empty() && info.versionCompatible;
}

//! The engine file of ``stage``: ``engineFile`` when given, else the one the "engine" section names
//! (inside the build folder); UserError when it does not exist.
std::string engineFilePath(Stage const& stage, Json const& engine, std::string const& manifestPath,
    std::string const& engineFile)
{
    std::string path;
    if (!engineFile.empty())
    {
        path = engineFile;
    }
    else
    {
        if (!engine["file"].isString())
        {
            fieldError(manifestPath, "engine.file", engine["file"], "a file name", kRebuild);
        }
        path = confined(stage.folder, engine["file"].string, manifestPath + " field engine.file", kRebuild);
    }
    if (!isFile(path))
    {
        throw UserError(stage.label + ": the engine file " + path + " does not exist; " + kRebuild + ".");
    }
    return path;
}

//! The manifest's "profiles"."dims" ([min, opt, max] per named dim) into ``stage.profile``.
void readProfileDims(Stage& stage, Json const& dims, std::string const& manifestPath)
{
    if (!dims.isNull() && !dims.isObject())
    {
        fieldError(manifestPath, "profiles.dims", dims, "an object of [min, opt, max]", kRebuild);
    }
    for (auto const& [name, values] : dims.object)
    {
        bool ok = values.isArray() && values.array.size() == 3;
        for (size_t i = 0; ok && i < 3; ++i)
        {
            ok = values.array[i].isInteger() && values.array[i].number >= 0;
        }
        ok = ok && values.array[0].number <= values.array[1].number && values.array[1].number <= values.array[2].number;
        if (!ok)
        {
            fieldError(manifestPath, "profiles.dims." + name, values, "[min, opt, max] with min <= opt <= max", kRebuild);
        }
        stage.profile[name] = DimRange{static_cast<int64_t>(values.array[0].number),
            static_cast<int64_t>(values.array[1].number), static_cast<int64_t>(values.array[2].number)};
    }
}

//! Read one build folder's manifest.json into ``stage`` (all but index, device and label).
//! ``engineFile``: use this engine file instead of the one the manifest names.
void readStageManifest(Stage& stage, std::string const& manifestPath, std::string const& engineFile)
{
    stage.manifestPath = manifestPath;
    stage.folder = fs::path(manifestPath).parent_path().string();
    if (stage.folder.empty())
    {
        stage.folder = ".";
    }
    Json const data = readManifestFile(stage, manifestPath);
    Json const& engine = data["engine"];
    if (engine.isNull())
    {
        throw UserError(stage.label + ": " + stage.folder
            + " holds no engine (only the ONNX Runtime artifact); rebuild it with --backend tensorrt.");
    }
    if (!engine.isObject())
    {
        fieldError(manifestPath, "engine", engine, "an object", kRebuild);
    }
    readEngineInfo(stage, engine, manifestPath);
    stage.engine.path = engineFilePath(stage, engine, manifestPath, engineFile);
    stage.inputs = readSpecs(data["inputs"], manifestPath, "inputs");
    stage.outputs = readSpecs(data["outputs"], manifestPath, "outputs");
    readProfileDims(stage, data["profiles"]["dims"], manifestPath);
}

std::string names(std::vector<TensorSpec> const& specs)
{
    std::string text;
    for (TensorSpec const& spec : specs)
    {
        text += (text.empty() ? "" : ", ") + spec.name;
    }
    return text.empty() ? "none" : text;
}

void checkDevice(Stage const& stage, int deviceCount, std::string const& where)
{
    if (deviceCount <= 0)
    {
        throw UserError("no CUDA GPU is visible, so " + stage.label + " cannot be opened.");
    }
    if (stage.device < 0 || stage.device >= deviceCount)
    {
        throw UserError(stage.label + " asks for GPU " + std::to_string(stage.device) + " but "
            + std::to_string(deviceCount) + " GPU" + (deviceCount == 1 ? " is" : "s are") + " visible (0.."
            + std::to_string(deviceCount - 1) + "); fix \"device\" in " + where
            + " or make the GPU visible (CUDA_VISIBLE_DEVICES).");
    }
}

//! The pipeline.json being read, for the error messages of readPipeline's helpers.
struct PipelineFile
{
    std::string path;  //!< the pipeline.json
    std::string root;  //!< its folder, which every stage build must stay inside
    std::string fix{"export and build the stages again"};
};

//! ``file``'s JSON, checked to be a dsa-export pipeline of a version this program reads.
Json readPipelineJson(PipelineFile const& file)
{
    std::string const& path = file.path;
    std::string const& fix = file.fix;
    Json data = readJsonFile(path, fix);
    if (!data["format"].isString() || data["format"].string != kPipelineFormat)
    {
        throw UserError(path + " is not a dsa-export pipeline file (no \"format\": \"" + kPipelineFormat + "\"); " + fix + ".");
    }
    if (data.has("version") && integer(data["version"], path, "version", fix) > kPipelineVersion)
    {
        throw UserError(path + " has pipeline format " + shown(data["version"]) + ", newer than this program reads ("
            + std::to_string(kPipelineVersion) + "); update tools/cpp_runtime.");
    }
    return data;
}

//! The GPU of stage ``index`` (``entry`` is stages[index], ``at`` its name): "device", or by
//! default the stage index modulo the GPU count.
int stageDevice(Json const& entry, int index, std::string const& at, PipelineFile const& file, PlanOptions const& options)
{
    if (entry.has("device") && !entry["device"].isNull())
    {
        int64_t const device = integer(entry["device"], file.path, at + ".device", file.fix);
        if (device < 0)
        {
            fieldError(file.path, at + ".device", entry["device"], "a GPU index >= 0", file.fix);
        }
        return static_cast<int>(std::min<int64_t>(device, 1 << 30));
    }
    return options.deviceCount > 0 ? index % options.deviceCount : 0;
}

//! stages[``position``] of the pipeline: its index, GPU and build folder, whose manifest.json is read.
Stage readPipelineStage(Json const& entry, size_t position, PipelineFile const& file, PlanOptions const& options)
{
    std::string const& path = file.path;
    std::string const& fix = file.fix;
    std::string const at = "stages[" + std::to_string(position) + "]";
    if (!entry.isObject())
    {
        fieldError(path, at, entry, "an object", fix);
    }
    Stage stage;
    stage.index = entry.has("index") ? static_cast<int>(integer(entry["index"], path, at + ".index", fix))
                                     : static_cast<int>(position);
    if (stage.index != static_cast<int>(position))
    {
        throw UserError(path + " lists stage " + std::to_string(stage.index) + " at position " + std::to_string(position)
            + "; stages must be listed in order 0, 1, 2, ...; " + fix + ".");
    }
    // Absent or null (as manifest.StageFiles writes None): the defaults.
    bool const hasBuild = entry.has("build") && !entry["build"].isNull();
    std::string const build = hasBuild ? (entry["build"].isString() ? entry["build"].string : std::string())
                                       : stageFolderName(stage.index);
    if (hasBuild && !entry["build"].isString())
    {
        fieldError(path, at + ".build", entry["build"], "a folder name", fix);
    }
    stage.label = "stage " + std::to_string(stage.index) + " (" + build + ")";
    stage.device = stageDevice(entry, stage.index, at, file, options);
    std::string const folder = confined(file.root, build, path + " field " + at + ".build", fix);
    readStageManifest(stage, (fs::path(folder) / "manifest.json").string(), "");
    checkDevice(stage, options.deviceCount, path);
    return stage;
}

//! links[i] (``at``) as written: {from, to, output, input}, stage indices clamped to -1 .. 2^30.
Link readLink(Json const& entry, std::string const& at, PipelineFile const& file)
{
    if (!entry.isObject() || !entry["output"].isString() || !entry["input"].isString())
    {
        fieldError(file.path, at, entry, "{from, to, output, input}", file.fix);
    }
    Link link;
    link.from = static_cast<int>(
        std::max<int64_t>(-1, std::min<int64_t>(integer(entry["from"], file.path, at + ".from", file.fix), 1 << 30)));
    link.to = static_cast<int>(
        std::max<int64_t>(-1, std::min<int64_t>(integer(entry["to"], file.path, at + ".to", file.fix), 1 << 30)));
    link.output = entry["output"].string;
    link.input = entry["input"].string;
    return link;
}

//! UserError unless ``link`` (``at``) goes from a stage of ``plan`` to a later one, names an output
//! and an input of the same dtype, and feeds an input no other link in ``fed`` feeds.
void checkLink(Plan const& plan, Link const& link, std::string const& at, PipelineFile const& file,
    std::map<std::pair<int, std::string>, std::string>& fed)
{
    std::string const where = file.path + " " + at + " (" + link.label() + ")";
    std::string const& fix = file.fix;
    int const count = static_cast<int>(plan.stages.size());
    for (int stage : {link.from, link.to})
    {
        if (stage < 0 || stage >= count)
        {
            throw UserError(where + " names stage " + std::to_string(stage) + ", but the pipeline has stages 0.."
                + std::to_string(count - 1) + "; " + fix + ".");
        }
    }
    if (link.from >= link.to)
    {
        throw UserError(where + " does not feed a later stage; stages run in order, so "
            + "a link must go from a stage to one after it; " + fix + ".");
    }
    Stage const& source = plan.stages[static_cast<size_t>(link.from)];
    Stage const& target = plan.stages[static_cast<size_t>(link.to)];
    TensorSpec const* output = source.output(link.output);
    if (output == nullptr)
    {
        throw UserError(where + " names the unknown tensor '" + link.output + "': " + source.label
            + "'s engine has the outputs " + names(source.outputs) + "; " + fix + ".");
    }
    TensorSpec const* input = target.input(link.input);
    if (input == nullptr)
    {
        throw UserError(where + " names the unknown tensor '" + link.input + "': " + target.label
            + "'s engine has the inputs " + names(target.inputs) + "; " + fix + ".");
    }
    if (output->dtype != input->dtype)
    {
        throw UserError(where + " joins tensors of different types: " + source.label + " gives " + output->dtype
            + " but " + target.label + " takes " + input->dtype + "; " + kRebuild + " with one precision.");
    }
    auto const key = std::make_pair(link.to, link.input);
    if (fed.count(key))
    {
        throw UserError(where + " feeds an input that " + fed[key] + " already feeds; " + fix + ".");
    }
    fed[key] = link.label();
}

//! One plugin library per process: stages built with different ones cannot share it (plans that
//! carry their library load it themselves).
void checkOnePluginLibrary(Plan const& plan)
{
    Stage const* first = nullptr;
    for (Stage const& stage : plan.stages)
    {
        if (stage.engine.pluginLibrarySha256.empty() || stage.engine.pluginsSerialized)
        {
            continue;
        }
        if (first == nullptr)
        {
            first = &stage;
        }
        else if (stage.engine.pluginLibrarySha256 != first->engine.pluginLibrarySha256)
        {
            throw UserError(stage.label + " was built with another DSA plugin library (sha256 "
                + stage.engine.pluginLibrarySha256.substr(0, 12) + ") than " + first->label + " (sha256 "
                + first->engine.pluginLibrarySha256.substr(0, 12)
                + "), and one process loads one; build all stages with the same plugin library.");
        }
    }
}

Plan readPipeline(std::string const& path, PlanOptions const& options)
{
    Plan plan;
    plan.source = path;
    plan.pipeline = true;
    PipelineFile file;
    file.path = path;
    Json const data = readPipelineJson(file);
    file.root = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
    Json const& stages = data["stages"];
    if (!stages.isArray() || stages.array.empty())
    {
        fieldError(path, "stages", stages, "a non-empty list of stages", file.fix);
    }
    for (size_t position = 0; position < stages.array.size(); ++position)
    {
        plan.stages.push_back(readPipelineStage(stages.array[position], position, file, options));
    }
    Json const& links = data["links"];
    if (!links.isNull() && !links.isArray())
    {
        fieldError(path, "links", links, "a list of links", file.fix);
    }
    std::map<std::pair<int, std::string>, std::string> fed;
    for (size_t i = 0; i < links.array.size(); ++i)
    {
        std::string const at = "links[" + std::to_string(i) + "]";
        Link const link = readLink(links.array[i], at, file);
        checkLink(plan, link, at, file, fed);
        plan.links.push_back(link);
    }
    checkOnePluginLibrary(plan);
    return plan;
}

} // namespace

TensorSpec const* Stage::input(std::string const& name) const
{
    for (TensorSpec const& spec : inputs)
    {
        if (spec.name == name)
        {
            return &spec;
        }
    }
    return nullptr;
}

TensorSpec const* Stage::output(std::string const& name) const
{
    for (TensorSpec const& spec : outputs)
    {
        if (spec.name == name)
        {
            return &spec;
        }
    }
    return nullptr;
}

std::string Link::label() const
{
    return std::to_string(from) + "." + output + " -> " + std::to_string(to) + "." + input;
}

Link const* Plan::linkInto(int stage, std::string const& input) const
{
    for (Link const& link : links)
    {
        if (link.to == stage && link.input == input)
        {
            return &link;
        }
    }
    return nullptr;
}

Plan readPlan(std::string const& path, PlanOptions const& options)
{
    fs::path const p(path);
    std::string const name = p.filename().string();
    if (isDir(path))
    {
        if (isFile((p / "pipeline.json").string()))
        {
            return readPipeline((p / "pipeline.json").string(), options);
        }
        if (!isFile((p / "manifest.json").string()))
        {
            throw UserError(path + " holds neither pipeline.json nor manifest.json; pass a folder written by `dsa-export build`.");
        }
    }
    else if (!isFile(path))
    {
        throw UserError(path + " does not exist; pass a build folder, its manifest.json or pipeline.json, or an engine file.");
    }
    else if (name == "pipeline.json")
    {
        return readPipeline(path, options);
    }

    Plan plan;
    Stage stage;
    stage.label = "the engine";
    stage.device = options.device < 0 ? 0 : options.device;
    std::string engineFile;
    std::string manifest;
    if (isDir(path))
    {
        manifest = (p / "manifest.json").string();
    }
    else if (name == "manifest.json")
    {
        manifest = path;
    }
    else
    {
        engineFile = path;
        manifest = ((p.parent_path().empty() ? fs::path(".") : p.parent_path()) / "manifest.json").string();
        if (!isFile(manifest))
        {
            throw UserError(path + " has no manifest.json next to it, so its TensorRT version, inputs and profile are "
                "unknown; rebuild it with `dsa-export build`, which writes one.");
        }
    }
    plan.source = manifest;
    readStageManifest(stage, manifest, engineFile);
    checkDevice(stage, options.deviceCount, "--device");
    plan.stages.push_back(stage);
    return plan;
}

Sizes stageSizes(Stage const& stage, Sizes const& overrides)
{
    Sizes sizes;
    for (auto const& [name, range] : stage.profile)
    {
        sizes[name] = range.opt;
    }
    for (auto const& [name, size] : overrides)
    {
        sizes[name] = size;
    }
    return sizes;
}

Shape resolve(TensorSpec const& spec, Sizes const& sizes)
{
    Shape shape;
    for (Dim const& dim : spec.shape)
    {
        if (dim.name.empty())
        {
            shape.push_back(dim.size);
            continue;
        }
        auto const it = sizes.find(dim.name);
        shape.push_back(it == sizes.end() ? -1 : it->second);
    }
    return shape;
}

std::string toString(Shape const& shape)
{
    std::string text = "[";
    for (size_t i = 0; i < shape.size(); ++i)
    {
        text += (i ? ", " : "") + (shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
    }
    return text + "]";
}

namespace
{

std::string specShape(TensorSpec const& spec)
{
    std::string text = "[";
    for (size_t i = 0; i < spec.shape.size(); ++i)
    {
        text += (i ? ", " : "") + (spec.shape[i].name.empty() ? std::to_string(spec.shape[i].size) : spec.shape[i].name);
    }
    return text + "]";
}

} // namespace

void bindLinkedInput(Stage const& stage, TensorSpec const& input, Shape const& given, Link const& link, Sizes& sizes,
    std::map<std::string, std::string>& bound)
{
    std::string const mismatch = "shape mismatch on link " + link.label() + ": the output is " + toString(given) + " but "
        + stage.label + "'s input '" + input.name + "' is " + specShape(input);
    if (given.size() != input.shape.size())
    {
        throw UserError(mismatch + " (" + std::to_string(given.size()) + " dims, not " + std::to_string(input.shape.size())
            + "); " + kRebuild + ".");
    }
    for (size_t axis = 0; axis < given.size(); ++axis)
    {
        Dim const& dim = input.shape[axis];
        int64_t const size = given[axis];
        if (size < 0)
        {
            continue;  // not known before the run; checked against the engine's real shape then
        }
        if (dim.name.empty())
        {
            if (size != dim.size)
            {
                throw UserError(mismatch + " (axis " + std::to_string(axis) + " is " + std::to_string(size) + ", not "
                    + std::to_string(dim.size) + "); " + kRebuild + ".");
            }
            continue;
        }
        auto const range = stage.profile.find(dim.name);
        if (range != stage.profile.end() && (size < range->second.min || size > range->second.max))
        {
            throw UserError(mismatch + " (" + dim.name + " " + std::to_string(size) + " is outside that engine's profile "
                + std::to_string(range->second.min) + ".." + std::to_string(range->second.max) + "); pass --dim "
                + dim.name + "=SIZE within it or rebuild the stage with a wider profile.");
        }
        auto const first = bound.find(dim.name);
        if (first != bound.end() && sizes[dim.name] != size)
        {
            throw UserError(mismatch + " (" + dim.name + " " + std::to_string(size) + ", but link " + first->second
                + " set it to " + std::to_string(sizes[dim.name]) + "); " + kRebuild + ".");
        }
        sizes[dim.name] = size;
        bound.emplace(dim.name, link.label());
    }
}

void checkInputShape(Stage const& stage, TensorSpec const& spec, Shape const& shape)
{
    for (size_t axis = 0; axis < shape.size() && axis < spec.shape.size(); ++axis)
    {
        Dim const& dim = spec.shape[axis];
        if (dim.name.empty())
        {
            continue;
        }
        if (shape[axis] < 0)
        {
            throw UserError(stage.label + "'s input '" + spec.name + "' has the dynamic dim '" + dim.name
                + "' and its manifest gives no size for it; pass --dim " + dim.name + "=SIZE.");
        }
        auto const range = stage.profile.find(dim.name);
        if (range != stage.profile.end() && (shape[axis] < range->second.min || shape[axis] > range->second.max))
        {
            throw UserError(stage.label + "'s input '" + spec.name + "' has " + dim.name + " " + std::to_string(shape[axis])
                + " (axis " + std::to_string(axis) + "), outside its optimization profile (" + dim.name + " "
                + std::to_string(range->second.min) + ".." + std::to_string(range->second.max)
                + "); pass --dim " + dim.name + "=SIZE within it or rebuild with a wider profile.");
        }
    }
}

std::vector<Sizes> checkShapes(Plan const& plan, Sizes const& overrides)
{
    std::vector<Sizes> all;
    for (Stage const& stage : plan.stages)
    {
        Sizes sizes = stageSizes(stage, overrides);
        std::map<std::string, std::string> bound;
        for (TensorSpec const& spec : stage.inputs)
        {
            Link const* link = plan.linkInto(stage.index, spec.name);
            if (link != nullptr)
            {
                Stage const& source = plan.stages[static_cast<size_t>(link->from)];
                Shape const given = resolve(*source.output(link->output), all[static_cast<size_t>(link->from)]);
                bindLinkedInput(stage, spec, given, *link, sizes, bound);
            }
        }
        for (TensorSpec const& spec : stage.inputs)
        {
            checkInputShape(stage, spec, resolve(spec, sizes));
        }
        all.push_back(sizes);
    }
    return all;
}

void checkEngineVersion(Stage const& stage, std::vector<int> const& runtime)
{
    EngineInfo const& engine = stage.engine;
    if (runtimeAccepts(parseVersion(engine.trtVersion), runtime, engine.versionCompatible, engine.backend))
    {
        return;
    }
    throw UserError("refusing to load " + stage.label + ": the " + std::string(engine.versionCompatible ? "version-compatible " : "")
        + "engine was built with TensorRT " + engine.trtVersion + " and cannot be loaded by the linked TensorRT "
        + formatVersion(runtime) + "; link TensorRT " + engine.trtVersion + " or rebuild the engine with `dsa-export build`"
        + (engine.versionCompatible ? "" : " (add --version-compatible to allow newer runtimes)") + ".");
}

void checkComputeCapability(Stage const& stage, int major, int minor, std::string const& gpuName)
{
    std::string const needs = computeCapabilityNeeds(stage.engine.computeCapability, stage.engine.hardwareCompatibility, major, minor);
    if (!needs.empty())
    {
        throw UserError("refusing to load " + stage.label + ": the engine was built for " + needs + " but GPU "
            + std::to_string(stage.device) + " (" + gpuName + ") is " + std::to_string(major) + "." + std::to_string(minor)
            + "; rebuild it on that GPU with `dsa-export build` (or with hardware compatibility for Ampere and newer).");
    }
}

void parseDimOption(std::string const& item, Sizes& sizes)
{
    auto const eq = item.find('=');
    char* end = nullptr;
    long long const size = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq == 0 || end == item.c_str() + eq + 1 || *end != '\0' || size < 0)
    {
        throw std::invalid_argument("--dim takes NAME=SIZE, e.g. sequence=256 (got '" + item + "')");
    }
    sizes[item.substr(0, eq)] = size;
}

std::string describe(Plan const& plan, std::vector<Sizes> const& sizes)
{
    std::ostringstream out;
    out << (plan.pipeline ? "pipeline " : "build ") << plan.source << ": " << plan.stages.size() << " stage"
        << (plan.stages.size() == 1 ? "" : "s") << ", " << plan.links.size() << " link" << (plan.links.size() == 1 ? "" : "s")
        << "\n";
    for (Stage const& stage : plan.stages)
    {
        Sizes const& s = sizes.at(static_cast<size_t>(stage.index));
        out << stage.label << " on GPU " << stage.device << ": " << stage.engine.path << " (TensorRT " << stage.engine.trtVersion
            << (stage.engine.versionCompatible ? ", version compatible" : "")
            << (stage.engine.pluginLibrarySha256.empty() ? ""
                   : stage.engine.pluginsSerialized   ? ", DSA plugins serialized in the plan"
                                                      : ", DSA plugins")
            << ")\n";
        for (TensorSpec const& spec : stage.inputs)
        {
            Link const* link = plan.linkInto(stage.index, spec.name);
            out << "  input  " << spec.name << " " << toString(resolve(spec, s)) << " " << spec.dtype
                << (link ? " <- stage " + std::to_string(link->from) + "." + link->output : std::string()) << "\n";
        }
        for (TensorSpec const& spec : stage.outputs)
        {
            out << "  output " << spec.name << " " << toString(resolve(spec, s)) << " " << spec.dtype << "\n";
        }
    }
    for (Link const& link : plan.links)
    {
        int const a = plan.stages[static_cast<size_t>(link.from)].device;
        int const b = plan.stages[static_cast<size_t>(link.to)].device;
        out << "link " << link.label() << ": GPU " << a << " -> GPU " << b << (a == b ? " (same GPU, no copy)" : "") << "\n";
    }
    return out.str();
}

} // namespace dsa
